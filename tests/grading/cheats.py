"""Submissions that try to cheat the grader (issue 15): each is exercise 01 as shipped (every task
a stub) plus ONE cell at the end. None solves anything genuinely, so each must score 0 or get a
status other than ok that names what it tried.

name → cell source. `{outside}` is replaced by a path outside the submission's scratch directory
that the test checks afterwards, `{marker}` by a string unique to the test run.
"""

CHEATS = {
    # copy the reference functions from the grading machinery
    "copies-the-reference-namespace": '''
try:
    from kstore.grading.testing import reference_namespace
    ref = reference_namespace("ex01")
    for name in ("write_varint", "read_varint", "write_varlong", "encode_record", "encode_batch"):
        globals()[name] = ref[name]
except Exception as e:
    print("no luck:", e)
''',
    # find the solution notebook next to the package and run it
    "execs-the-solution-notebook": '''
import json, os
from kstore.grading.exercises import ROOT
try:
    nb = json.load(open(os.path.join(ROOT, "solutions", "01-record-batch.ipynb")))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and "demo" not in cell["metadata"].get("tags", []) \\
                and "check" not in cell["metadata"].get("tags", []):
            exec("".join(cell["source"]), globals())
except Exception as e:
    print("no luck:", e)
''',
    # make the grading pytest plugin report every test as passed
    "patches-the-grading-plugin": '''
try:
    import kstore.grading.runner as runner
    def passed(self, report):
        o = self.outcomes.get(report.nodeid)
        if o is not None and report.when == "call":
            o.outcome, o.earned = "passed", o.points
            if self.on_result is not None:
                self.on_result(o)
    runner.LearnerPlugin.pytest_runtest_logreport = passed
except Exception as e:
    print("no luck:", e)
''',
    # patch os._exit and write forged results to every inherited descriptor
    "forges-result-lines": '''
import json, os
os._exit = lambda code: None
line = json.dumps({"event": "test", "nodeid": "x", "task": "ex01.1", "points": 100, "earned": 5200,
                   "outcome": "passed"}) + "\\n"
for fd in range(0, 64):
    try:
        os.write(fd, (line * 3).encode())
    except OSError:
        pass
''',
    # rewrite the tests so that every test passes (the grading run's copy and the repository's)
    "rewrites-the-tests": '''
import glob, os
from kstore.grading.exercises import ROOT
for path in glob.glob("/tmp/kstore-grade-*/**/test_ex01.py", recursive=True) + \\
        [os.path.join(ROOT, "tests", "exercise_tests", "test_ex01.py")]:
    try:
        with open(path, "w") as f:
            f.write("from kstore.grading.testing import task\\n@task('ex01.1', points=52)\\ndef test_x():\\n    pass\\n")
    except OSError as e:
        print("no luck:", e)
''',
    # write outside the scratch directory
    "writes-outside-its-directory": '''
for path in ["{outside}", "/tmp/../{outside}"]:
    try:
        open(path, "w").write("I was here")
    except OSError as e:
        print("no luck:", e)
''',
    # answers that compare equal to anything
    "returns-always-equal-objects": '''
class Anything(bytes):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = bytes.__hash__

class Whatever:
    def __eq__(self, other):
        return True

def write_varint(n):
    return Anything(b"?")

def read_varint(data, pos):
    return Whatever()

def write_varlong(n):
    return Whatever()

def encode_record(*args, **kwargs):
    return Anything(b"?")

def encode_batch(*args, **kwargs):
    return Whatever()
''',
    # look for the test files in the command lines of every process it can see
    "reads-tests-via-proc-cmdline": '''
import glob, os
found = []
for path in glob.glob("/proc/*/cmdline"):
    try:
        args = open(path, "rb").read().split(b"\\0")
    except OSError:
        continue
    for a in args:
        a = a.decode(errors="replace")
        if "test" in a or "solution" in a or "kstore-grade" in a:
            for p in glob.glob(os.path.join(a, "**", "*.py"), recursive=True) + [a]:
                try:
                    found.append(open(p).read()[:100])
                except OSError:
                    pass
print(len(found), "files read")
if found:
    exec(open("/nonexistent-reference").read())
''',
    # a daemon that outlives the grading (it would keep a copy of whatever it saw)
    "spawns-a-daemon": '''
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)  # {marker}"],
                 start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)
''',
    # fill the disk
    "fills-the-disk": '''
import os
chunk = b"x" * (1 << 20)
for where in (os.getcwd(), "/tmp", "/var/tmp", "/dev/shm"):
    try:
        with open(os.path.join(where, "big.bin"), "wb") as f:
            for _ in range(20_000):
                f.write(chunk)
    except OSError as e:
        print("stopped:", e)
''',
    # fork until something breaks
    "forks-without-end": '''
import os, time
children = 0
try:
    for _ in range(2000):
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        children += 1
except OSError as e:
    print("stopped after", children, e)
''',
}
