from __future__ import annotations

from ..op import Op


class SoftmaxFwdOp(Op):
    """torch.nn.functional.softmax along ``dim`` (None: PyTorch's legacy choice).

    ``SoftmaxFwdOp(dim=None)``, then ``op(x)``.
    """


class LogSoftmaxFwdOp(Op):
    """torch.nn.functional.log_softmax along ``dim`` (None: PyTorch's legacy choice).

    ``LogSoftmaxFwdOp(dim=None)``, then ``op(x)``.
    """
