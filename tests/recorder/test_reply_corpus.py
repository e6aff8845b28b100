"""Hundreds of generated engine replies, good and bad, through the real recorder over loopback.

Each reply is served byte for byte by a test-double engine (``canned_engine.py``) to a real
recorder (its raw chat protocol, its HTTP/1.1 engine client, its store); the oracle in
``reply_corpus.py`` says what each reply proves. Every record must agree: untrainable with a reason
where the evidence is doubtful, trainable with exactly the engine's ids and logprobs where it is
sound -- never trainable with other ids.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer

from agentloop import ADMIN, TOOLS
from canned_engine import CannedEngine
from reply_corpus import generate, judge

CASES = 640
SESSIONS = 8


@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory: pytest.TempPathFactory):
    cases = generate(seed=15, count=CASES, sessions=SESSIONS)
    store = tmp_path_factory.mktemp("corpus") / "r.db"
    with CannedEngine() as engine:
        for case in cases:
            engine.add(case.key, case.raw)
        config = RecorderConfig(store_path=str(store), engine_url=engine.url, admin_token=ADMIN, probe_template=False, probe_logprobs_mode=False)
        with RecorderServer(config) as server, RecorderClient(server.url, ADMIN) as admin:
            sessions = [admin.create_session() for _ in range(SESSIONS)]

            def run(session_index: int) -> dict[str, int]:
                s = sessions[session_index]
                statuses = {}
                with httpx.Client(timeout=30, headers={"authorization": f"Bearer {s['secret']}"}) as client:
                    for case in cases:
                        if case.session == session_index:
                            body = {"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": case.key}]}
                            statuses[case.key] = client.post(f"{s['base_url']}/chat/completions", json=body).status_code
                return statuses

            with ThreadPoolExecutor(4) as pool:
                statuses = {k: v for part in pool.map(run, range(SESSIONS)) for k, v in part.items()}
            records = {}
            for s in sessions:
                for record in admin.records(s["session_id"]):
                    records[record["request"]["messages"][-1]["content"]] = record
            yield cases, statuses, records, engine.served


def test_every_reply_ends_as_a_correct_record(corpus_run) -> None:
    cases, statuses, records, served = corpus_run
    assert served == len(cases) and len(records) == len(cases)
    outcomes: Counter[str] = Counter()
    wrong: list[str] = []
    for case in cases:
        verdict = judge(case.raw)
        record = records[case.key]
        md = record["metadata"]
        trainable, status = md["trainable"], md["status"]
        outcomes[f"{verdict.outcome} -> {status}{' trainable' if trainable else ''}"] += 1
        exact = (trainable and record["prompt_token_ids"] == verdict.prompt
                 and record["completion_token_ids"] == verdict.completion
                 and record["per_token_logps"] == verdict.logprobs)
        if verdict.outcome == "failed":
            ok = status == "failed" and not trainable and statuses[case.key] == 502
        elif verdict.outcome == "reject":
            ok = not trainable and status in ("invalid", "failed") and (status == "failed" or md["invalid_reasons"])
        elif verdict.outcome == "accept":
            ok = status == "ok" and exact
        else:  # either: doubtful but not wrong
            ok = exact or (not trainable and md["invalid_reasons"])
        if trainable and not exact:
            ok = False  # never trainable with other ids than the engine's
        if not ok:
            wrong.append(f"{case.key} [{case.kind}] oracle={verdict.outcome} ({verdict.why}) record={status} "
                         f"trainable={trainable} reasons={md.get('invalid_reasons')} raw={case.raw[:300]!r}")
    print("\nengine-reply corpus outcomes (oracle -> record):", dict(sorted(outcomes.items())))
    assert not wrong, f"{len(wrong)} of {len(cases)} replies recorded wrongly:\n" + "\n".join(wrong[:40])
