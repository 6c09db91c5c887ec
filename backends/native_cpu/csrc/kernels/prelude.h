// What an ISA translation unit (isa_*.cc) includes before it opens its namespace: the
// system headers the kernels use, the element types, every family's args and the table
// the families register into. The kernel files themselves include nothing (they are
// compiled inside the ISA's namespace).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "dtypes.h"
#include "kernel_table.h"
#include "kernels/attention_args.h"
#include "kernels/elementwise_args.h"
#include "kernels/gemm_args.h"
#include "kernels/moe_args.h"
#include "kernels/norm_args.h"
#include "kernels/quant_args.h"
#include "kernels/reduction_args.h"
#include "kernels/rope_args.h"
#include "kernels/softmax_args.h"
#include "thread_pool.h"
