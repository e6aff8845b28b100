"""A generated corpus of malformed requests to a recorder, and what each must get.

Four families, each built from a seeded generator so that the corpus is the same on every run and
large enough to find the next class of bug, not just the last one:

* **body**: valid HTTP carrying a bad agent body -- broken JSON (truncations, byte flips, invalid
  UTF-8, JSON extensions), wrong shapes and types, deep nesting, integers beyond 64 bits, too
  large -- and bodies the engine itself rejects (the only ones that reach it: a failed record);
* **headers**: bad authentication, oversized and too many headers, a long request line, invalid
  header names and values, folded lines, conflicting or malformed framing headers;
* **framing**: broken request lines, bad HTTP versions, unknown methods, TLS and binary noise, bad
  chunked encoding, bodies longer or shorter than declared, pipelined garbage, half-closed
  requests, connections that open and go;
* **routes**: wrong methods, unknown paths, control-plane calls without or with the wrong token or
  with bad bodies, viewer login abuse.

Each ``Case`` says what is acceptable: particular 4xx statuses (and, for the recorder's own
refusals, the error code), or ``CLOSE`` -- the connection closed without an answer, for framing
that ends before a request does. ``slow`` cases leave a request unfinished and need a recorder
with short head and body timeouts (they then get 408).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import orjson

from rawhttp import request

CLOSE = "close"


@dataclass
class Case:
    family: str
    name: str
    pieces: list[bytes]
    expect: frozenset[int | str]
    code: str | None = None  #: the error code a JSON refusal must carry, when it is the recorder's own
    half_close: bool = False  #: shut the sending side once sent (the client is done)
    replies: int = 1  #: replies to wait for (pipelined cases)
    slow: bool = False  #: left unfinished on purpose: needs short timeouts
    engine_rejects: bool = False  #: reaches the engine, which refuses it (recorded as failed)
    bodiless: bool = False  #: the reply carries no body whatever its content-length says (HEAD)


@dataclass
class Target:
    chat_path: str
    secret: str
    admin_token: str
    max_header_bytes: int
    max_header_count: int
    max_body_bytes: int
    max_json_depth: int


@dataclass
class _Builder:
    target: Target
    rng: random.Random
    cases: list[Case] = field(default_factory=list)

    def add(self, family: str, name: str, data: bytes | list[bytes], expect: set[int | str] | int | str,
            **kwargs: object) -> None:
        expected = frozenset(expect if isinstance(expect, set) else {expect})
        pieces = data if isinstance(data, list) else [data]
        self.cases.append(Case(family, name, pieces, expected, **kwargs))  # type: ignore[arg-type]

    # -- helpers -------------------------------------------------------------------------------------

    @property
    def auth(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.target.secret}"), ("content-type", "application/json")]

    def chat(self, body: bytes, headers: list[tuple[str, str]] | None = None, **kwargs: object) -> bytes:
        return request("POST", self.target.chat_path, [*(self.auth if headers is None else headers)], body,
                       **kwargs)  # type: ignore[arg-type]

    def text(self) -> str:
        return "".join(self.rng.choice("abcdefghij klmnop") for _ in range(self.rng.randint(1, 40)))

    def valid_body(self) -> bytes:
        return orjson.dumps({"model": "reference-model",
                             "messages": [{"role": "user", "content": self.text()}], "max_tokens": 16})


def _body_family(b: _Builder) -> None:
    t, rng = b.target, b.rng
    add = b.add
    # broken JSON: every prefix of a valid body is invalid, as are most single-byte flips
    for i in range(150):
        body = b.valid_body()
        cut = rng.randrange(0, len(body) - 1)
        add("body", f"truncated JSON #{i}", b.chat(body[:cut]), 400, code="invalid_json")
    flips = 0
    while flips < 150:
        body = bytearray(b.valid_body())
        at = rng.randrange(len(body))
        body[at] = rng.choice(b'{}[]:,"\\\x00\x01tfn-+.eE')
        try:
            orjson.loads(bytes(body))
            continue  # still valid JSON: not this family's business
        except orjson.JSONDecodeError:
            pass
        flips += 1
        add("body", f"flipped byte #{flips}", b.chat(bytes(body)), 400, code="invalid_json")
    extensions = [b"NaN", b"Infinity", b"-Infinity", b"01", b"+1", b".5", b"1.", b"0x10", b"'x'",
                  b"undefined", b"True", b"None", b"\"\\ud800\"", b"\"\\x41\"", b"\"\t\"", b"[1,]", b"{\"a\":1,}",
                  b"/* c */ 1", b"1 // c"]
    for value in extensions:
        body = b'{"model":"reference-model","messages":[{"role":"user","content":"x"}],"temperature":' + value + b"}"
        add("body", f"JSON extension {value[:12]!r}", b.chat(body), 400, code="invalid_json")
    for literal in [b"1e400", b"-1e309", b"1" + b"0" * 400 + b".5", b"2E+999"]:  # valid JSON, beyond a double
        body = b'{"model":"reference-model","messages":[{"role":"user","content":"x"}],"temperature":' + literal + b"}"
        add("body", f"number beyond a double {literal[:10]!r}", b.chat(body), 400, code="number_out_of_range")
    invalid_utf8 = [b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80", b"\xe2\x82", b"\xf4\x90\x80\x80"]
    for i, raw in enumerate(invalid_utf8 * 3):
        body = b'{"messages":[{"role":"user","content":"' + b.text().encode() + raw + b'"}]}'
        add("body", f"invalid UTF-8 #{i}", b.chat(body), 400, code="invalid_json")
    for i, body in enumerate([b"", b" ", b"\n\n", b"\xef\xbb\xbf{}", b"{}{}", b'{"messages":[]} x', b"\x00",
                              b'{"messages":[{"role":"user","content":"x"}]}\x00']):
        add("body", f"not one JSON value #{i}", b.chat(body), 400, code="invalid_json")
    # valid JSON, wrong shape
    for value in [b"[]", b"[{}]", b'"messages"', b"1", b"-0.5", b"null", b"true", b"false", b'[{"role":"user"}]']:
        add("body", f"top level {value[:10]!r}", b.chat(value), 400, code="invalid_body")
    bad_messages = [b'{}', b'{"model":"m"}', b'{"messages":null}', b'{"messages":[]}', b'{"messages":{}}',
                    b'{"messages":"hi"}', b'{"messages":1}', b'{"messages":[1]}', b'{"messages":[null]}',
                    b'{"messages":[[]]}', b'{"messages":["user"]}', b'{"messages":[{}]}',
                    b'{"messages":[{"role":1}]}', b'{"messages":[{"role":null}]}', b'{"messages":[{"role":[]}]}',
                    b'{"messages":[{"content":"x"}]}', b'{"messages":[{"role":"user"},2]}',
                    b'{"messages":[{"role":"user","content":"x"}],"messages":[]}']
    for i, body in enumerate(bad_messages):
        add("body", f"bad messages #{i}", b.chat(body), 400, code="invalid_messages")
    msgs = b'"messages":[{"role":"user","content":"x"}]'
    for value in [b"true", b"false", b"1.0", b"2", b"0", b"-1", b'"1"', b"[1]", b"{}", b"1e0", b"99999999999"]:
        add("body", f"n={value!r}", b.chat(b"{" + msgs + b',"n":' + value + b"}"), 400, code="invalid_n")
    for value in [b'{"a":1}', b'"bash"', b"1", b"true"]:
        add("body", f"tools={value!r}", b.chat(b"{" + msgs + b',"tools":' + value + b"}"), 400, code="invalid_tools")
    for value in [b'"yes"', b"1", b"0", b"null", b"[]", b'"true"']:
        add("body", f"stream={value!r}", b.chat(b"{" + msgs + b',"stream":' + value + b"}"), 400,
            code="invalid_stream")
    # nesting past the limit, in every part of a body
    for i in range(40):
        levels = rng.choice([t.max_json_depth + 1, t.max_json_depth + 2, 100, 255, 256, 300, 500, 1000])
        where = rng.choice(["metadata", "content", "tools", "extra"])
        inner = b"[" * levels + b"]" * levels
        body = {"metadata": b"{" + msgs + b',"metadata":' + inner + b"}",
                "content": b'{"messages":[{"role":"user","content":' + inner + b"}]}",
                "tools": b"{" + msgs + b',"tools":[{"type":"function","function":{"name":"f","parameters":'
                         + inner + b"}}]}",
                "extra": b"{" + msgs + b',"x":{"y":' + inner + b"}}"}[where]
        add("body", f"nested {levels} in {where}", b.chat(body), 400, code="too_deeply_nested")
    for i in range(10):  # past orjson's own parse limit: refused as JSON
        levels = rng.randint(1025, 5000)
        add("body", f"nested {levels} (past the parser)", b.chat(b"{" + msgs + b',"x":' + b"[" * levels + b"]" * levels
                                                                 + b"}"), 400, code="invalid_json")
    # integers orjson cannot keep exact
    for i in range(30):
        digits = rng.randint(20, 700)  # past ~309 digits orjson cannot even hold it as a float
        literal = (rng.choice([b"", b"-"]) + str(rng.randint(1, 9)).encode()
                   + bytes(rng.choice(b"0123456789") for _ in range(digits - 1)))
        where = rng.choice([b',"seed":%s', b',"metadata":{"a":[1,%s]}', b',"logit_bias":{"5":%s}'])
        add("body", f"{digits}-digit integer", b.chat(b"{" + msgs + where % literal + b"}"), 400,
            code="integer_out_of_range")
    for literal in [b"18446744073709551616", b"-9223372036854775809", b"100000000000000000000"]:
        add("body", f"just past 64 bits {literal!r}", b.chat(b"{" + msgs + b',"seed":' + literal + b"}"), 400,
            code="integer_out_of_range")
    # too large: declared, and chunked without a declaration
    for i in range(6):
        size = t.max_body_bytes + rng.randint(1, 100_000)
        filler = b'{"messages":[{"role":"user","content":"' + b"z" * size + b'"}]}'
        add("body", f"oversized body {size}", b.chat(filler), 413, code="body_too_large")
    for i in range(4):
        filler = b"y" * (t.max_body_bytes + 10)
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (filler[:40_000], filler[40_000:])) + b"0\r\n\r\n"
        head = request("POST", t.chat_path, [*b.auth, ("transfer-encoding", "chunked")])
        add("body", f"oversized chunked body #{i}", head + chunks, 413, code="body_too_large")
    # bodies only the engine refuses: forwarded, refused by it, recorded as failed
    for i in range(12):
        body = orjson.dumps({"model": "reference-model", "messages": [{"role": "user", "content": f"reject {i}"}],
                             "max_tokens": -rng.randint(1, 1000)})
        add("body", f"engine rejects max_tokens #{i}", b.chat(body), 400, engine_rejects=True)
    for i, (name, value) in enumerate([("max_completion_tokens", 0), ("max_completion_tokens", -1),
                                       ("max_tokens", "many"), ("top_logprobs", 21), ("top_logprobs", 1000),
                                       ("chat_template_kwargs", "x"), ("chat_template_kwargs", [])]):
        body = orjson.dumps({"model": "reference-model", "messages": [{"role": "user", "content": f"field {i}"}],
                             name: value})
        add("body", f"engine rejects {name}={value!r}", b.chat(body), 400, engine_rejects=True)


def _headers_family(b: _Builder) -> None:
    t, rng = b.target, b.rng
    add, body = b.add, b'{"messages":[{"role":"user","content":"hi"}]}'
    json_type = ("content-type", "application/json")
    wrong_keys = ["", " ", "Bearer", "oeh-", t.secret[:-1], t.secret + "x", t.secret.upper(), "oeh-" + "A" * 43,
                  t.admin_token, "null", "undefined", t.secret[1:]]
    for i, key in enumerate(wrong_keys):
        add("headers", f"wrong bearer key #{i}", b.chat(body, [("authorization", f"Bearer {key}"), json_type]), 401)
        add("headers", f"wrong x-api-key #{i}", b.chat(body, [("x-api-key", key), json_type]), 401)
    for i, value in enumerate(["Basic " + t.secret, "Token " + t.secret, t.secret, "Bearer", "Bearer ",
                               "bearer", "Digest x", "Bearer\t", "Bearer " + t.secret + " extra"]):
        add("headers", f"wrong scheme #{i}", b.chat(body, [("authorization", value), json_type]), 401)
    add("headers", "no key", b.chat(body, [json_type]), 401)
    add("headers", "wrong authorization, right x-api-key",
        b.chat(body, [("authorization", "Bearer nope"), ("x-api-key", t.secret), json_type]), 401)
    for i in range(40):
        size = rng.choice([t.max_header_bytes + 1, t.max_header_bytes * 2, 100_000, 1 << 20, rng.randint(9000, 300_000)])
        name = rng.choice(["x-filler", "cookie", "user-agent", "authorization", "accept"])
        path = rng.choice([t.chat_path, "/healthz", "/admin/health", "/v1/models", "/viewer/", "/nope"])
        method = "POST" if path == t.chat_path else "GET"
        add("headers", f"{size}-byte {name} on {path}",
            request(method, path, [*b.auth, (name, "h" * size)], body if method == "POST" else b""), 431,
            code="header_too_large")
    for i in range(40):
        count = rng.choice([t.max_header_count + 1, t.max_header_count + 5, 200, 1000, rng.randint(40, 3000)])
        path = rng.choice([t.chat_path, "/healthz", "/admin/health"])
        method = "POST" if path == t.chat_path else "GET"
        many = [*b.auth, *((f"x-{j}", "v") for j in range(count))]
        data = request(method, path, many, body if method == "POST" else b"")
        code = "too_many_headers" if data.index(b"\r\n\r\n") + 4 <= t.max_header_bytes else None  # else either
        add("headers", f"{count} headers on {path}", data, 431, code=code)
    for i in range(20):
        size = rng.randint(t.max_header_bytes, 200_000)
        path = rng.choice(["/healthz?", t.chat_path + "?", "/" + "p" * 10])
        add("headers", f"{size}-byte request target", request("GET", path + "q" * size), 431, code="header_too_large")
    for i, char in enumerate(" @{}()<>,;\\\"/[]?=\t\x01\x7f"):
        head = b"GET /healthz HTTP/1.1\r\nhost: x\r\nbad" + char.encode() + b"name: v\r\n\r\n"
        add("headers", f"invalid header name char {char!r}", head, 400, code="invalid_http")
    for i, char in enumerate([b"\x00", b"\x01", b"\x08", b"\x0b", b"\x0c", b"\x1f", b"\x7f", b"\r"]):
        head = b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-v: a" + char + b"b\r\n\r\n"
        add("headers", f"invalid header value byte {char!r}", head, 400, code="invalid_http")
    for i, fold in enumerate([b" folded", b"\tfolded", b"  two spaces"]):
        add("headers", f"obs-fold #{i}", b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-a: 1\r\n" + fold + b"\r\n\r\n", 400,
            code="invalid_http")
    for i, line in enumerate([b"nocolon", b": empty name", b" leading-space: v", b"x-a : spaced name"]):
        add("headers", f"malformed header line #{i}", b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + line + b"\r\n\r\n",
            400, code="invalid_http")
    body_head = ("POST " + t.chat_path + " HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + t.secret + "\r\n").encode()
    lengths = [b"abc", b"-1", b"+5", b"0x10", b"5 5", b"1e3", b"99999999999999999999999", b"", b"4,4", b"\x00"]
    for i, value in enumerate(lengths):
        add("headers", f"content-length {value!r}", body_head + b"content-length: " + value + b"\r\n\r\n" + body, 400,
            code="invalid_http")
    for i, (first, second) in enumerate([(b"5", b"6"), (b"0", b"44"), (b"44", b"45")]):
        head = body_head + b"content-length: " + first + b"\r\ncontent-length: " + second + b"\r\n\r\n"
        add("headers", f"conflicting content-length #{i}", head + body, 400, code="invalid_http")
    for i, te in enumerate([b"chunked", b"gzip, chunked", b"chunked, gzip", b"identity"]):
        head = body_head + b"transfer-encoding: " + te + b"\r\ncontent-length: 44\r\n\r\n"
        add("headers", f"transfer-encoding {te!r} with content-length", head + body, 400, code="invalid_http")
    for i, te in enumerate([b"gzip", b"x-custom", b"chunked\x00"]):
        add("headers", f"transfer-encoding {te!r}", body_head + b"transfer-encoding: " + te + b"\r\n\r\n" + body, 400,
            code="invalid_http")


def _framing_family(b: _Builder) -> None:
    t, rng = b.target, b.rng
    add = b.add
    lines = [b"GET", b"GET / HTTP/1.7", b"GET / HTTP/9.9", b"GET / HTTPS/1.1", b"GET / http/1.1",
             b"GET / HTTP/1.1 extra", b"get /healthz HTTP/1.1", b"BREW / HTTP/1.1",
             b"FOO /healthz HTTP/1.1", b"POST\t/ HTTP/1.1", b"G\x00ET / HTTP/1.1", b"GET /\x00 HTTP/1.1",
             b"GET /\x7f HTTP/1.1", b"GET / HTTP/1.1\r", b" GET / HTTP/1.1", b"GET / HTTP/1.1\n",
             b"\xff\xfe\xfd", b"HTTP/1.1 200 OK", b"GET / HTTP/1.1\rhost: x"]
    for i, line in enumerate(lines):
        add("framing", f"request line {line[:24]!r}", line + b"\r\nhost: x\r\n\r\n", 400, code="invalid_http")
    add("framing", "request line with two spaces", b"GET  / HTTP/1.1\r\nhost: x\r\n\r\n", {400, 404})  # parser leniency
    tls = bytes.fromhex("160301010001000100030355") + bytes(rng.randrange(256) for _ in range(60))
    add("framing", "TLS ClientHello", tls, 400, code="invalid_http")
    noise = 0
    while noise < 60:
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 400))) + b"\r\n\r\n"
        if junk[:1].isupper() or junk[:1] in (b"\r", b"\n"):  # could start a request: keep to what certainly is not
            continue
        noise += 1
        add("framing", f"binary noise #{noise}", junk, 400, code="invalid_http")
    chunked_head = request("POST", t.chat_path, [*b.auth, ("transfer-encoding", "chunked")])
    bad_chunks = [b"zz\r\nabc\r\n0\r\n\r\n", b"3\r\nabcd\r\n0\r\n\r\n", b"-1\r\nx\r\n0\r\n\r\n",
                  b"ffffffffffffffffffff\r\nx\r\n", b"3 3\r\nabc\r\n0\r\n\r\n", b"3\nabc\n0\n\n",
                  b"\r\n\r\n", b"3;\x00\r\nabc\r\n0\r\n\r\n", b"0x3\r\nabc\r\n0\r\n\r\n", b"3\r\nabc0\r\n\r\n"]
    for i, chunks in enumerate(bad_chunks * 2):
        add("framing", f"bad chunked #{i}", chunked_head + chunks, 400, code="invalid_http")
    for i in range(25):  # declared longer than sent, then the client is done: no request, no answer
        body = b.valid_body()
        sent = rng.randrange(0, len(body))
        add("framing", f"short body, half-closed #{i}", b.chat(body[:sent], content_length=len(body)), CLOSE,
            half_close=True)
    for i in range(15):
        cut = rng.randrange(1, 60)
        add("framing", f"head cut at {cut}, half-closed", b.chat(b.valid_body())[:cut], CLOSE, half_close=True)
    for i in range(10):
        add("framing", f"chunked body cut, half-closed #{i}", chunked_head + b"10\r\n" + b"x" * rng.randrange(0, 16),
            CLOSE, half_close=True)
    add("framing", "connect and hang up", b"", CLOSE, half_close=True)
    for i in range(20):  # declared shorter than sent: the rest is a second, garbage request
        body = b.valid_body()
        declared = rng.randrange(1, len(body) - 1)
        add("framing", f"body longer than declared #{i}", b.chat(body, content_length=declared) + b"\r\n\r\n",
            {400}, replies=2)
    for i in range(10):  # two bad calls on one kept-alive connection
        add("framing", f"pipelined bad calls #{i}", b.chat(b"{" * (i + 1)) + b.chat(b"[" + b"]" * i), 400, replies=2)
    for i in range(10):
        add("framing", f"pipelined 404 then garbage #{i}",
            request("GET", f"/nope/{i}") + bytes(rng.randrange(128, 256) for _ in range(20)) + b"\r\n\r\n",
            {400, 404}, replies=2)
    for i in range(8):
        add("framing", f"HTTP/1.0 bad body #{i}", b.chat(b"{" * (i + 1), version="1.0"), 400, code="invalid_json")
    for i in range(5):
        add("framing", f"expect 100-continue, too large #{i}",
            b.chat(b"", [*b.auth, ("expect", "100-continue")], content_length=t.max_body_bytes + 1 + i), 413,
            code="body_too_large")
    for i in range(6):
        add("framing", f"huge declared body #{i}", b.chat(b"{}", content_length=10 ** rng.randint(8, 18)), 413,
            code="body_too_large")
    # unfinished on purpose, the connection kept open: 408 once the (short) timeout passes
    for i in range(8):
        cut = rng.randrange(1, 60)
        add("framing", f"slow head, cut at {cut}", b.chat(b.valid_body())[:cut], 408, code="request_timeout", slow=True)
    for i in range(8):
        body = b.valid_body()
        add("framing", f"slow body #{i}", b.chat(body[: len(body) // 2], content_length=len(body)), 408,
            code="request_timeout", slow=True)
    add("framing", "slow admin body", request("POST", "/admin/sessions", [("authorization", f"Bearer {t.admin_token}")],
                                              b'{"metadata":', content_length=100), 408, slow=True)
    add("framing", "connect and say nothing", b"", CLOSE, slow=True)


def _routes_family(b: _Builder) -> None:
    t, rng = b.target, b.rng
    add = b.add
    for method in ["GET", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]:
        add("routes", f"{method} on the chat route", request(method, t.chat_path, b.auth), 405,
            bodiless=method == "HEAD")
    for i in range(40):
        path = "/" + "/".join(b.text().replace(" ", "-") or "x" for _ in range(rng.randint(1, 4)))
        add("routes", f"unknown path #{i}", request(rng.choice(["GET", "POST"]), path, b.auth, b"{}"), 404)
    for i, path in enumerate(["/rollout//v1/chat/completions", "/rollout/a/b/v1/chat/completions",
                              "/v1//chat/completions", "/rollout/%2e%2e/v1/models/x"]):
        add("routes", f"near-miss chat path #{i}", request("POST", path, b.auth, b"{}"), {401, 404, 405})
    for i, session in enumerate(["unknown-session", "s-" + "0" * 16, "%00", "a" * 200]):
        add("routes", f"chat for another session #{i}",
            request("POST", f"/rollout/{session}/v1/chat/completions", b.auth, b'{"messages":[]}'), 401)
    admin_routes = [("GET", "/admin/sessions"), ("POST", "/admin/sessions"), ("GET", "/admin/health"),
                    ("POST", "/admin/fence/pause"), ("POST", "/admin/policy_version"), ("GET", "/metrics"),
                    ("POST", "/admin/viewer/codes"), ("GET", "/viewer/"), ("GET", "/admin/viewer/api/sessions/x/calls")]
    for method, path in admin_routes:
        for j, headers in enumerate([[], [("authorization", f"Bearer {t.secret}")],
                                     [("authorization", "Bearer " + t.admin_token[:-1])],
                                     [("cookie", f"oeh_admin={t.admin_token}")]]):
            add("routes", f"{method} {path} unauthorized #{j}", request(method, path, headers, b"{}" if method == "POST"
                                                                           else b""), 401)
    admin = [("authorization", f"Bearer {t.admin_token}"), ("content-type", "application/json")]
    bad_specs = [b"{", b"[]", b'{"budgets":{"max_calls":-1}}', b'{"session_id":"bad id"}', b'{"nope":1}',
                 b'{"budgets":{"max_calls":"many"}}', b'{"metadata":[]}', b'{"aux_rules":{}}', b'"x"',
                 b'{"budgets":{"max_wall_clock_s":0}}']
    for i, spec in enumerate(bad_specs):
        add("routes", f"bad session spec #{i}", request("POST", "/admin/sessions", admin, spec), 422)
    for i, form in enumerate([b"token=wrong", b"token=", b"", b"token=" + t.secret.encode(), b"\xff\xfe=\x00",
                              b"next=/viewer/&token=" + b"%00" * 10]):
        add("routes", f"viewer login form #{i}", request("POST", "/viewer/login",
                                                         [("content-type", "application/x-www-form-urlencoded")], form),
            401)
    add("routes", "viewer login form too large", request("POST", "/viewer/login",
                                                           [("content-type", "application/x-www-form-urlencoded")],
                                                           b"token=" + b"x" * 10_000), 413)
    add("routes", "viewer login with the token in the URL", request("GET", "/viewer/login?token=" + t.admin_token), 400)
    for i in range(4):
        add("routes", f"viewer login with a made-up code #{i}", request("GET", f"/viewer/login?code={b.text().replace(' ', '-')}"), 401)


def build_corpus(target: Target, seed: int = 15) -> list[Case]:
    b = _Builder(target, random.Random(seed))
    _body_family(b)
    _headers_family(b)
    _framing_family(b)
    _routes_family(b)
    return b.cases
