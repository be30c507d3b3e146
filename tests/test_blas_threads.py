"""llmem keeps numpy's OpenBLAS to one thread (llmem/__init__.py): a search's vector scan and
its FTS query already run on a thread each."""

import os
import subprocess
import sys

PROBE = "import llmem, os; print(os.environ.get('OPENBLAS_NUM_THREADS'))"


def _probe(env):
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_a_process_that_imports_llmem_gives_openblas_one_thread():
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    assert _probe(env) == "1"


def test_a_thread_count_the_user_set_is_kept():
    assert _probe({**os.environ, "OPENBLAS_NUM_THREADS": "4"}) == "4"
