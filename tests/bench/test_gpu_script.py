"""The one script that runs every GPU check and measurement, dry-run on the CPU: it must run end to end."""

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_script_runs_its_steps_on_the_cpu(tmp_path):
    result = subprocess.run(["bash", "results/bench-gpu/run.sh", str(tmp_path)], cwd=ROOT, capture_output=True,
                            text=True, timeout=600, env={**os.environ, "DRY_RUN": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    tests = (tmp_path / "cuda-tests.txt").read_text()
    assert "passed" in tests and "failed" not in tests and "error" not in tests.lower()
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["meta"]["device"] == "cpu" and {"lstm+fast", "bart-ct2-float32"} <= {
        row["model"] for row in results["rows"]}
    for strategy, expected in (("beam4", {"num_beams": 4}), ("sampling", {"do_sample": True, "top_k": 10})):
        meta = json.loads((tmp_path / strategy / "results.json").read_text())["meta"]
        assert expected.items() <= meta["generation"].items(), strategy
