"""The ``torch.backends`` entry point: registers the ``neuron`` device when torch is imported.

torch calls :func:`autoload` at the end of ``import torch`` for every installed device backend,
and an exception there would make ``import torch`` itself fail, so this never raises: a device
that cannot load is a warning. It loads the device library only (``torchneuron._device``, which
links libtorch), never the compiler extension ``_C`` or ``torch._dynamo``.
``TORCHNEURON_DEVICE_AUTOLOAD=0`` (or torch's ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``) skips it;
``import torchneuron.device; torchneuron.device.register()`` then registers it by hand.
"""

from __future__ import annotations

import os
import warnings


def autoload() -> None:
    if os.environ.get("TORCHNEURON_DEVICE_AUTOLOAD", "1") == "0":
        return
    try:
        from torchneuron import device

        device.register()
    except Exception as e:  # never break `import torch`
        warnings.warn(
            f"torchneuron: the neuron device could not be registered ({type(e).__name__}: {e}); "
            "torch works without it (TORCHNEURON_DEVICE_AUTOLOAD=0 silences this)",
            RuntimeWarning,
            stacklevel=2,
        )
