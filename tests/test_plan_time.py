"""benchmarks/plan_time.py: the planner it times beside this package's (``--base``) is loaded from a file."""

import inspect
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import plan_time  # noqa: E402
from mla_var3.kernel import decode_plan  # noqa: E402


def test_a_base_planner_loads_from_a_module_file_beside_the_package_s(tmp_path):
    assert plan_time.load_planner(None) is decode_plan
    copy = tmp_path / "old_decode_plan.py"
    copy.write_text(inspect.getsource(decode_plan).replace("PACK_OVERHEAD = 4", "PACK_OVERHEAD = 3"))
    base = plan_time.load_planner(str(copy))
    assert base is not decode_plan and base.PACK_OVERHEAD == 3 and decode_plan.PACK_OVERHEAD == 4
    lengths = [300, 4096, 77, 1500]
    assert (base.plan_reference(lengths, 128, capacity=4096)["items"]
            == decode_plan.plan_reference(lengths, 128, capacity=4096)["items"])
