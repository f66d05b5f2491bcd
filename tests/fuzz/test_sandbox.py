"""The fuzz sandbox turns a hang and a crash of the worker into outcomes and carries on
with a fresh worker; what a case gives there is what it gives in this process."""

import threading

import fuzz_runner
import onnx_graphs
from fuzz_sandbox import Sandbox


def test_hang_and_crash_are_outcomes_and_the_next_case_runs():
    with Sandbox(timeout=0.5) as box:
        # A fresh worker needs seconds to import TVM: more than the timeout.
        hung = box.run("elementwise", 2, 0, "mini")
        assert hung.kind == "timeout" and hung.first_line == "timeout: no result after 0.5 s"

        box.timeout = 300
        box._restart()
        threading.Timer(1.0, box._proc.kill).start()  # dies while it imports
        crashed = box.run("elementwise", 2, 0, "mini")
        assert crashed.first_line == "crash: killed by SIGKILL"

        again = box.run("elementwise", 2, 0, "mini")
    here = fuzz_runner.run_case(onnx_graphs.case("elementwise", 2, 0), "mini")
    assert again.kind == here.kind == "ok"
    assert again.rel_err == here.rel_err and again.offload == here.offload
