"""The fixed text the reference tokenizer is trained on.

Why a corpus embedded in code: the reference engine must produce the same vocabulary, with the
same ids, in every process on every machine, without downloading anything. Training a byte-level
BPE on a fixed text with fixed settings gives exactly that. The text mixes plain English with the
things coding agents actually send and sample -- shell commands, JSON tool calls, Python, file
listings -- so that common words and JSON punctuation get merges and prompts stay reasonably short.

``corpus_lines()`` is deterministic: the generated part enumerates fixed word lists in a fixed
order (no randomness), so the output is a pure function of this file.
"""

from __future__ import annotations

import itertools
import json

_PROSE = """\
You are a coding assistant working inside a terminal. You help users by reading files, running
commands, editing code and writing new files. Use the tools available to you. When the task is
done, answer with a short summary of what you did and what you found.
The user asked me to run the shell command and tell them what it printed. I will run it now.
I ran the command and it printed the expected output. The tests pass and the build is clean.
Let me look at the repository first. I will list the files in the current directory, then read
the README and the main module. After that I can decide which function needs to change.
The function returns the wrong value when the input list is empty. I will add a check at the
start of the function and a test that covers the empty case.
Done. The file was updated and all tests pass.
I could not find the file you mentioned. Please check the path and try again.
The command failed with exit code 1. The error says that the module was not found. I will
install the missing package and run the command again.
Here is a summary of the changes: the parser now accepts empty input, the server returns a clear
error for bad requests, and the documentation explains the new option.
Thinking about the problem: the loop reads one line at a time, so the last line is lost when the
file does not end with a newline. The fix is to process the remaining buffer after the loop.
Tool run summary. Generate a brief title that would help the user find this conversation later.
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single
step. Time flies like an arrow; fruit flies like a banana. All that glitters is not gold.
It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of
foolishness. The model reads the prompt, samples one token at a time, and stops at the end of
its turn. Every token has an id and a log probability.
The weather today is sunny with a light breeze. Tomorrow will be cloudy, and it may rain in the
evening. Remember to take an umbrella if you go out.
Please read the configuration file, update the port number to 8080 and restart the service.
Then check the logs for errors and report back with the status of each component.
"""

_CODE = """\
def main() -> int:
    parser = argparse.ArgumentParser(description="Run the task.")
    parser.add_argument("--path", default=".", help="Where to look.")
    args = parser.parse_args()
    for name in sorted(os.listdir(args.path)):
        print(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

class Counter:
    \"\"\"Counts things.\"\"\"

    def __init__(self, start: int = 0) -> None:
        self.value = start

    def add(self, amount: int = 1) -> int:
        self.value += amount
        return self.value

import json
import os
import sys
from pathlib import Path

def read_config(path: str) -> dict:
    with open(path, "r", encoding="utf-8") as handle:
        return json.load(handle)

async def fetch(client, url: str) -> dict:
    response = await client.get(url, timeout=30.0)
    response.raise_for_status()
    return response.json()

function add(a, b) {
  return a + b;
}
const result = JSON.parse(text);
console.log(JSON.stringify(result));
export default { name: "tool", version: "1.0.0" };
"""

_SHELL = """\
$ ls -la
total 24
drwxr-xr-x  4 user user 4096 Jan  1 12:00 .
drwxr-xr-x 10 user user 4096 Jan  1 12:00 ..
-rw-r--r--  1 user user  220 Jan  1 12:00 README.md
-rw-r--r--  1 user user 1024 Jan  1 12:00 main.py
drwxr-xr-x  2 user user 4096 Jan  1 12:00 tests
$ echo hi
hi
$ cat README.md
# Project
A small example project.
$ python -m pytest -q
....                                                                     [100%]
4 passed in 0.12s
$ git status
On branch main
nothing to commit, working tree clean
$ grep -rn "def " src/ | head
$ find . -name "*.py" -type f
$ pwd
/home/agent/task
$ mkdir -p build && cd build
$ pip install -e .
Successfully installed package-0.1.0
$ export PATH="$HOME/.local/bin:$PATH"
"""

#: A few hundred common English words, so that ordinary prose gets whole-word tokens.
_VOCABULARY = """\
about above across act action active activity add added address after again against age agent
ago agree ahead air all allow almost alone along already also although always among amount
analysis and animal another answer any anyone anything appear apply approach area argue arm
around arrive art article artist as ask assume at attack attention attribute audience author
authority available avoid away baby back bad bag ball bank bar base batch be beat beautiful
because become bed before begin behavior behind believe benefit best better between beyond big
bill billion bit black blood blue board body book born both box boy branch break bring brother
budget buffer bug business but buy by cache call camera campaign can cancer candidate capital
car card care career carry case catch cause cell center central century certain certainly chain
chair challenge chance change channel character charge cheap child choice choose church citizen
city civil claim class clear clearly client close coach cold collection college color column
come commercial common community company compare compile computer concern condition conference
congress consider constant consumer contain context continue contract control cost could count
country couple course court cover crash create crime cultural culture cup current customer cut
daemon dark data daughter day dead deal death debate debug decade decide decision deep default
defense degree democrat depend deploy describe design despite detail determine develop
development device die difference different difficult dinner direction director directory
discover discuss discussion disease disk do doctor dog door down draw dream drive drop drug
during each early east easy eat economic economy edge education effect effort eight either
election else employee end energy enjoy enough enter entire environment episode equal especially
establish even evening event ever every everybody everyone everything evidence exactly example
exception executive exist expect experience expert explain eye face fact factor fail fall family
far fast father fear federal feel feeling few field fight figure fill film final finally
financial find fine finger finish fire firm first fish five floor fly focus folder follow food
foot for force foreign forget form format former forward four free friend from front full fund
future game garden gas general generation get girl give glass go goal good government great
green ground group grow growth guess gun guy hair half hand handle hang happen happy hard hash
have he head health hear heart heat heavy help her here herself high him himself his history hit
hold home hope hospital host hot hotel hour house how however huge human hundred husband idea
identify if image imagine impact import important improve in include including increase indeed
index indicate individual industry information inside instead institution integer interest
interesting international interview into investment involve issue it item its itself job join
just keep key kid kill kind kitchen know knowledge land language large last late later laugh law
lawyer lay lead leader learn least leave left leg legal less let letter level library lie life
light like likely limit line link lip listen little live load local lock long look lose loss lot
love low machine magazine main maintain major majority make man manage management manager many
map market marriage material matter may maybe me mean measure media medical meet meeting member
memory mention merge method middle might military million mind minute miss mission modern module
moment money month more morning most mother mouth move movement movie much music must my myself
name nation national natural nature near nearly necessary need network never new news newspaper
next nice night no node none nor north not note nothing notice now null number object obtain
occur of off offer office officer official often oh oil ok old on once one only onto open
operation opportunity option or order organization other others our out outside over own owner
package page pain painting paper parent part participant particular particularly partner party
pass past patch patient pattern pay peace people per perform performance perhaps period person
personal phone physical pick picture piece place plan plant play player point police policy
political politics poor popular population port position positive possible power practice
prepare present president pressure pretty prevent price private probably problem process produce
product production professional professor program project property protect prove provide public
pull purpose push put quality query question queue quickly quite race radio raise range rate
rather reach ready real reality realize really reason receive recent recently recognize record
red reduce reflect region relate relationship release religious remain remember remove report
represent republican require research resource respond rest retry rich right rise risk road rock
role room root rule safe same save say scene school science scientist score sea season seat
second section security see seek seem sell send senior sense series serious serve service set
seven several shake share she shoot short shot should shoulder show side sign significant
similar simple simply since sing single sister sit site situation six size skill skin small
smile so social society soldier some somebody someone something sometimes son song soon sort
sound source south southern space speak special specific speech spend sport spring staff stage
stand standard star start state statement station stay step still stock stop store story
strategy street string strong structure student study stuff style subject success successful
such suddenly suffer suggest summer support sure surface table take talk target teach teacher
team technology television tell ten tend term terminal than thank that their them themselves
then theory there these they thing think third this those though thought thousand threat three
through throughout throw thus time timeout to today together tonight too top total tough toward
town trade traditional training travel treat treatment tree trial trip trouble true truth try
turn type under understand unit until up upon us use usually valid variable various version very
victim view violence visit voice vote wait walk wall want war watch water way we weapon wear
week weight well west western what whatever when where whether which while white who whole whom
whose why wide wife will win wind window wish with within without woman wonder word work worker
world worry would wrong yard yeah year yes yet you young your yourself
"""

_WORDS = (
    "the", "a", "file", "command", "output", "error", "test", "function", "value", "list",
    "name", "path", "read", "write", "run", "edit", "line", "code", "task", "result", "tool",
    "model", "token", "server", "request", "response", "message", "user", "assistant", "system",
    "done", "check", "update", "create", "delete", "search", "find", "print", "return", "build",
)
_TOOLS = ("bash", "read", "write", "edit", "glob", "grep", "list", "search", "todowrite", "webfetch")
_COMMANDS = (
    "ls", "ls -la", "echo hi", "pwd", "cat README.md", "python main.py", "pytest -q",
    "git status", "git diff", "make test", "npm test", "grep -rn TODO .", "head -n 20 main.py",
    "wc -l *.py", "echo hello world", "python -c 'print(1 + 1)'", "cd src && ls",
)
_PATHS = ("main.py", "README.md", "src/app.py", "tests/test_app.py", "config.json", "setup.py",
          "package.json", "src/index.js", "notes.txt", "Makefile")


def _generated_lines() -> list[str]:
    """Enumerate tool calls, JSON objects and sentences from the fixed lists above."""
    lines: list[str] = []
    for command, timeout in itertools.product(_COMMANDS, (None, 5, 30, 120)):
        args: dict[str, object] = {"command": command}
        if timeout is not None:
            args["timeout"] = timeout
        compact = json.dumps(args, separators=(",", ":"))
        spaced = json.dumps(args)
        lines.append(f'<tool_call>\n{{"name": "bash", "arguments": {compact}}}\n</tool_call>')
        lines.append(f'{{"name": "bash", "arguments": {spaced}}}')
    for tool, path in itertools.product(_TOOLS, _PATHS):
        call = {"name": tool, "arguments": {"path": path, "offset": 0, "limit": 200}}
        lines.append(json.dumps(call))
        lines.append(json.dumps(call, separators=(",", ":")))
        lines.append(f"I will use the {tool} tool on {path} and check the result.")
    for first, second in itertools.product(_WORDS[:20], _WORDS[20:]):
        lines.append(f"The {first} {second} is ready. Please {first} the {second} again.")
    for tool in _TOOLS:
        schema = {
            "type": "function",
            "function": {
                "name": tool,
                "description": f"Use {tool} to work with files and commands in the workspace.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "The file path."},
                        "command": {"type": "string", "description": "The command to run."},
                        "timeout": {"type": "integer", "description": "Timeout in seconds."},
                    },
                    "required": ["path"],
                },
            },
        }
        lines.append(json.dumps(schema))
    common = _VOCABULARY.split()
    for start in range(0, len(common), 6):
        group = common[start : start + 6]
        lines.append(" ".join(group).capitalize() + ".")
        lines.append(", ".join(w.capitalize() for w in group) + "; " + " and ".join(group) + ".")
    for role in ("system", "user", "assistant", "tool"):
        lines.extend([f"{role}", f"The {role} message.", f"role: {role}"] * 4)
    for number in range(0, 400, 7):
        lines.append(f"line {number}: value = {number * 3} # step {number % 10}")
    return lines


def corpus_lines() -> list[str]:
    """The full training corpus, one entry per line; identical in every process."""
    handwritten = (_PROSE + _CODE + _SHELL).splitlines()
    # The hand-written text is repeated so that its words outrank the generated patterns.
    return handwritten * 3 + _generated_lines()
