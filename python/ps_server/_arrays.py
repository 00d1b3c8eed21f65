"""Arrays handed to the compiled module: float32 in C order in CPU memory, shared, never
copied behind the caller's back. numpy arrays pass as they are; CPU torch tensors pass
through tensor.numpy(), which shares their memory."""

import numpy as np


def _torch_tensor_type():
    try:
        import torch
    except ImportError:  # torch is optional
        return None
    return torch.Tensor


def is_torch(value):
    tensor = _torch_tensor_type()
    return tensor is not None and isinstance(value, tensor)


def as_float32(value, what, ndim=None):
    """`value` as a float32 numpy array of `ndim` dimensions (None: any) in C order sharing
    its memory.

    Raises TypeError for another dtype or a tensor outside CPU memory, ValueError for
    another number of dimensions or a non-contiguous view. Nothing is converted: a
    float64 array is refused rather than copied, so what is encoded or aggregated is
    exactly what the caller holds.
    """
    if is_torch(value):
        if value.device.type != "cpu":
            raise TypeError(
                f"{what} is on {value.device}; ps_server reads CPU memory: pass tensor.cpu()"
            )
        if value.requires_grad:
            value = value.detach()
        import torch

        if value.dtype != torch.float32:
            raise TypeError(f"{what} must be float32, got {value.dtype}")
        if not value.is_contiguous():
            raise ValueError(f"{what} must be contiguous; use tensor.contiguous()")
        array = value.numpy()
    elif isinstance(value, np.ndarray):
        array = value
    else:
        raise TypeError(
            f"{what} must be a numpy array or a torch tensor, got {type(value).__name__}"
        )
    if array.dtype != np.float32:
        raise TypeError(f"{what} must be float32, got {array.dtype}")
    if ndim is not None and array.ndim != ndim:
        raise ValueError(f"{what} must have {ndim} dimension{'' if ndim == 1 else 's'}, got {array.ndim}")
    if not array.flags["C_CONTIGUOUS"]:
        raise ValueError(f"{what} must be contiguous (C order); use numpy.ascontiguousarray")
    return array


def like(result, template):
    """`result` (a numpy array) as a torch tensor sharing its memory when `template` is
    one, else as it is."""
    if is_torch(template):
        import torch

        return torch.from_numpy(result)
    return result
