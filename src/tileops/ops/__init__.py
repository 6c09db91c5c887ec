"""Every tileops op. Each is declared in a manifest (``tileops/manifest/*.yaml``) and
constructed with its manifest params plus keyword-only ``target``, ``kernel_map``, ``tune``.

    from tileops.ops import RMSNormFwdOp
    y = RMSNormFwdOp(normalized_shape=(4096,))(x, weight)
"""

from .attention.gqa import GroupedQueryAttentionDecodeWithKVCacheFwdOp, GroupedQueryAttentionFwdOp
from .bmm import BmmFwdOp
from .elementwise.activations import GeluFwdOp, ReluFwdOp, SiluAndMulFwdOp, SiluFwdOp
from .elementwise.binary import AddFwdOp, MulFwdOp
from .elementwise.clamp import ClampFwdOp
from .gemm import GemmFwdOp
from .norm.fused_add_rms_norm import FusedAddRMSNormFwdOp
from .norm.group_norm import GroupNormFwdOp
from .norm.layer_norm import LayerNormFwdOp
from .norm.rms_norm import RMSNormFwdOp
from .op import Op
from .reduction.reduce import AmaxFwdOp, MeanFwdOp, SumFwdOp
from .reduction.softmax import LogSoftmaxFwdOp, SoftmaxFwdOp
from .rope import RopeNeoxFwdOp, RopeNeoxPositionIdsFwdOp

ALL_OPS: tuple[type[Op], ...] = (
    RMSNormFwdOp,
    FusedAddRMSNormFwdOp,
    LayerNormFwdOp,
    GroupNormFwdOp,
    SoftmaxFwdOp,
    LogSoftmaxFwdOp,
    SumFwdOp,
    MeanFwdOp,
    AmaxFwdOp,
    GemmFwdOp,
    BmmFwdOp,
    AddFwdOp,
    MulFwdOp,
    SiluFwdOp,
    GeluFwdOp,
    ReluFwdOp,
    SiluAndMulFwdOp,
    ClampFwdOp,
    RopeNeoxFwdOp,
    RopeNeoxPositionIdsFwdOp,
    GroupedQueryAttentionFwdOp,
    GroupedQueryAttentionDecodeWithKVCacheFwdOp,
)

__all__ = [cls.__name__ for cls in ALL_OPS] + ["ALL_OPS", "Op"]
