/* tileops' capture ABI: how a backend's kernels hand out the outputs of a captured launch.
 *
 * tileops.capture.Graph records the launches a stretch of code makes and replays them,
 * with torch.cuda.CUDAGraph's contract: a replay writes into the outputs made while
 * capturing. A kernel that allocates its outputs itself (as C++ kernels do) asks this ABI
 * first: while the calling thread runs a launch that a capture records or a replay re-runs,
 * `output` gives the output tensor (made through the backend's own `make` while capturing,
 * the same tensor again while replaying), so a replay writes in place and copies nothing.
 * A kernel that does not ask still replays correctly: tileops copies its fresh results into
 * the captured outputs after each launch.
 *
 * Reach it from C or C++ with
 *     const tileops_capture_abi* abi = PyCapsule_Import(TILEOPS_CAPTURE_ABI_CAPSULE, 0);
 * (with the GIL held; NULL, with an ImportError set, where tileops is older than this ABI)
 * and check `abi->version` against TILEOPS_CAPTURE_ABI_VERSION. The include directory is
 * `tileops.capture.include_dir()`. Every function must be called with the GIL held. */
#ifndef TILEOPS_CAPTURE_ABI_H_
#define TILEOPS_CAPTURE_ABI_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TILEOPS_CAPTURE_ABI_CAPSULE "tileops._C._capture_abi"
#define TILEOPS_CAPTURE_ABI_VERSION 1

/* Makes a new output tensor: returns a new reference to it (a PyObject*) and sets *data to
 * its first element, or returns NULL with a Python exception set. `ctx` is the caller's. */
typedef void* (*tileops_make_output)(void* ctx, int ndim, const int64_t* shape, void** data);

typedef struct tileops_capture_abi {
  uint32_t version; /* TILEOPS_CAPTURE_ABI_VERSION */
  /* Non-zero while this thread runs a launch that a capture records or a replay re-runs. */
  int (*in_launch)(void);
  /* The launch's next output, of `ndim` dims `shape` and the dtype the backend names
   * `dtype_word` (any int of its own, compared only with itself): while capturing, made by
   * `make(ctx, ...)` and kept; while replaying, the tensor made then. Returns a new
   * reference (PyObject*) and sets *data; NULL with a Python exception set when a replayed
   * launch asks for an output its capture did not make (its inputs changed shape). */
  void* (*output)(int ndim, const int64_t* shape, int64_t dtype_word, void** data, tileops_make_output make, void* ctx);
} tileops_capture_abi;

#ifdef __cplusplus
}
#endif

#endif /* TILEOPS_CAPTURE_ABI_H_ */
