"""The conversation benchmark's measure of the machine's other work during a turn: a busy
process outside the bench's tree counts, the bench's own children do not, exited ones too."""

from __future__ import annotations

import subprocess
import sys

from support.agentchat import CpuMark, cpu_mark, others_cores

SPIN = "import time\nwhile time.process_time() < {0}: pass\n"
"""A process that runs until it has used {0} s of CPU (however loaded the machine)."""


def test_others_cores_is_the_busy_time_less_ours_over_the_span():
    before = CpuMark(at_s=10.0, busy_s=100.0, ours_s=40.0)
    after = CpuMark(at_s=12.0, busy_s=104.0, ours_s=41.0)
    assert others_cores(before, after) == 1.5  # (4 - 1) s of other work over 2 s
    assert others_cores(before, CpuMark(12.0, 101.0, 42.0)) == 0.0  # never below none
    assert others_cores(before, before) is None


def test_the_cpu_of_a_child_that_exited_counts_as_ours():
    before = cpu_mark()
    subprocess.run([sys.executable, "-c", SPIN.format(0.4)], check=True)
    after = cpu_mark()
    assert after.ours_s - before.ours_s >= 0.3  # 10 ms ticks
    assert after.busy_s - before.busy_s >= 0.3
