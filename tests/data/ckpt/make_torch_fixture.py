"""Writes torch_mlp.safetensors (+ a BF16 copy, torch_mlp_bf16.safetensors) and torch_mlp.json:
the weights of a PyTorch MLP saved with safetensors.torch.save_file(model.state_dict()), an
input batch and the model's output, for the
"weights saved from PyTorch load into trainkit" test (tests/ckpt/test_model.cpp). Needs torch;
the outputs are committed, so CI does not.

    .venv-bench/bin/python tests/data/ckpt/make_torch_fixture.py
"""
import json
import os

import torch
from safetensors.torch import save_file

here = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(7, 3)
)
model.eval()
x = torch.randn(4, 5)
with torch.no_grad():
    y = model(x)
# A bf16 copy of the same weights (for the convert_dtype test) and an extra tensor.
save_file(model.state_dict(), os.path.join(here, "torch_mlp.safetensors"), metadata={"format": "pt"})
bf16 = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
save_file(bf16, os.path.join(here, "torch_mlp_bf16.safetensors"), metadata={"format": "pt"})
with open(os.path.join(here, "torch_mlp.json"), "w") as f:
    json.dump(
        {
            "input": [float(v) for v in x.flatten().tolist()],
            "input_shape": list(x.shape),
            "output": [float(v) for v in y.flatten().tolist()],
            "output_shape": list(y.shape),
            "torch": torch.__version__,
        },
        f,
        indent=1,
    )
    f.write("\n")
print("wrote", sorted(os.listdir(here)))
