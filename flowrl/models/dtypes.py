"""Config names of torch dtypes (``model.dtype``, reward ``dtype=`` settings)."""

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
