"""examples/embedding_to_sampredictor.py against a real CPU maskd on the golden tiny model: the
original SamPredictor, fed maskd's bf16 (and fp16) embedding, gives maskd's masks (IoU >= 0.99)."""
import os
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "embedding_to_sampredictor.py")


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_sampredictor_on_maskd_embedding_gives_maskd_mask(maskd_target, golden_dir, dtype):
    import json
    with open(os.path.join(golden_dir, "manifest.json")) as f:
        image = json.load(f)["images"][0]
    x, y = image["cases"][0]["points"][0]
    r = subprocess.run(
        [sys.executable, EXAMPLE, os.path.join(golden_dir, image["png"]), "--server", maskd_target,
         "--checkpoint", os.path.join(golden_dir, "sam_tiny.pth"),
         "--golden-manifest", os.path.join(golden_dir, "manifest.json"),
         "--point", f"{x},{y}", "--dtype", dtype, "--min-iou", "0.99"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(__file__), "..")})
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "min IoU" in r.stdout
    assert r.stdout.count("IoU") >= 4  # three masks and the summary
