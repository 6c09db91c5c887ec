// Marshalling of the attention family (kernels/attention*.h): every grouped-query
// attention op, reduced to the per-request layout of kernels/attention_args.h. The op layer
// checks shapes and index values before a kernel is called; these checks repeat what a
// kernel relies on, so that a kernel called directly can refuse bad input too and never
// read outside a tensor.
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "bind/kernel.h"
#include "kernels/attention_args.h"

namespace tnc {
namespace {

// How an op lays out its tensors; each becomes AttentionArgs the same way.
enum class AttentionForm : int {
  prefill = 0,        // q [B, S, H, D], k, v [B, S, Hkv, D]
  decode = 1,         // q [B, H, D], k, v [B, N, Hkv, D]
  varlen = 2,         // q [Tq, H, D], k, v [Tk, Hkv, D], cu_seqlens_q, cu_seqlens_k [B+1] (+ unused descales)
  paged_prefill =
      3,  // q, k_new, v_new [T, .., D], k_pages, v_pages, k_scale, v_scale, cu_seqlens_q, cache_seqlens, block_table
  paged_decode = 4,   // q [B, H, D], k, v [pages * page_size, Hkv, D], seqlens [B], block_table [B, P]
};

PyObject* value_error(const Kernel& k, const std::string& text) {
  PyErr_Format(PyExc_ValueError, "%s: %s", k.description.c_str(), text.c_str());
  return nullptr;
}

std::string at(const char* what, int64_t i) { return std::string(what) + "[" + std::to_string(i) + "]"; }

// An int32 index tensor of the given rank (entries checked by the caller).
bool read_index(const Kernel& k, PyObject* obj, TensorView& v, const char* what, int ndim) {
  if (!read_tensor(obj, v, what)) return false;
  if (v.dtype != DType::i32 || v.ndim != ndim) {
    shape_error(k, ndim == 1 ? "expected a 1-D int32 tensor" : "expected a 2-D int32 tensor", v, what);
    return false;
  }
  return true;
}

// Offsets 0 = cu[0] <= cu[1] <= ... with cu[-1] == total (or <= total when `padded`).
bool check_offsets(const Kernel& k, const TensorView& cu, int64_t total, bool padded, const char* what) {
  const auto* c = static_cast<const int32_t*>(cu.data);
  const int64_t n = cu.shape[0];
  if (n < 2) return value_error(k, std::string(what) + " needs at least 2 offsets"), false;
  if (c[0] != 0) return value_error(k, at(what, 0) + " = " + std::to_string(c[0]) + ", expected 0"), false;
  for (int64_t i = 1; i < n; ++i)
    if (c[i] < c[i - 1])
      return value_error(k, at(what, i) + " is less than " + at(what, i - 1) + ": offsets must not decrease"), false;
  if (padded ? c[n - 1] > total : c[n - 1] != total)
    return value_error(k, at(what, n - 1) + " = " + std::to_string(c[n - 1]) + (padded ? " exceeds " : ", expected ") +
                              std::to_string(total)),
           false;
  return true;
}

// Every page the first lengths[b] positions of request b use lies in [0, pages).
bool check_pages(const Kernel& k, const TensorView& table, const std::vector<int64_t>& lengths, int64_t page_size,
                 int64_t pages) {
  const auto* t = static_cast<const int32_t*>(table.data);
  const int64_t width = table.shape[1];
  for (size_t b = 0; b < lengths.size(); ++b) {
    const int64_t n = lengths[b];
    if (n < 0 || n > width * page_size)
      return value_error(k, "request " + std::to_string(b) + " has " + std::to_string(n) +
                                " tokens; its block_table row holds " + std::to_string(width * page_size)),
             false;
    for (int64_t p = 0; p < (n + page_size - 1) / page_size; ++p) {
      const int32_t page = t[static_cast<int64_t>(b) * width + p];
      if (page < 0 || page >= pages)
        return value_error(k, "block_table[" + std::to_string(b) + ", " + std::to_string(p) +
                                  "] = " + std::to_string(page) + " points outside the cache's " +
                                  std::to_string(pages) + " pages"),
               false;
    }
  }
  return true;
}

struct AttentionKernel final : Kernel {
  AttentionForm form;
  int slots;  // the op's input slots (varlen: 5, or 8 with upstream's unused descales)
  int64_t head_dim, group, page_size;
  bool causal;
  int64_t window_left, window_right;
  float scale;  // 0: head_dim ** -0.5
  float softcap;
  bool padded_rows;  // varlen: rows past cu_seqlens_q[-1] are padding (zeros out)
  KernelFn<AttentionArgs> prefill, decode;

  PyObject* call(PyObject* const* args, Py_ssize_t nargs) override {
    if (!expect_args(*this, nargs, slots)) return nullptr;
    const bool paged = form == AttentionForm::paged_prefill || form == AttentionForm::paged_decode;
    TensorView q, k, v;
    // the keys the attention reads: the cache when paged (slots 3, 4 in paged prefill)
    const int ks = form == AttentionForm::paged_prefill ? 3 : 1;
    if (!read(*this, args[0], q, "q") || !read(*this, args[ks], k, "k") || !read(*this, args[ks + 1], v, "v"))
      return nullptr;
    const bool rows_q = form != AttentionForm::prefill;  // q is rows of [H, D]
    const int q_ndim = form == AttentionForm::prefill ? 4 : 3,
              kv_ndim = form == AttentionForm::prefill || form == AttentionForm::decode ? 4 : 3;
    if (q.ndim != q_ndim || q.shape[q_ndim - 1] != head_dim)
      return shape_error(*this, "q does not have the layout and head_dim of this kernel", q, "q");
    if (k.ndim != kv_ndim || k.shape[kv_ndim - 1] != head_dim)
      return shape_error(*this, "k does not have the layout and head_dim of this kernel", k, "k");
    for (int d = 0; d < kv_ndim; ++d)
      if (v.ndim != kv_ndim || v.shape[d] != k.shape[d]) return shape_error(*this, "v must have k's shape", v, "v");
    AttentionArgs a{};
    a.q = q.data;
    a.k = k.data;
    a.v = v.data;
    a.heads = q.shape[q_ndim - 2];
    a.heads_kv = k.shape[kv_ndim - 2];
    a.head_dim = head_dim;
    a.causal = causal;
    a.window_left = window_left;
    a.window_right = window_right;
    a.scale = scale > 0.f ? scale : 1.f / std::sqrt(static_cast<float>(head_dim));
    a.softcap = softcap;
    if (a.heads_kv == 0 || a.heads != a.heads_kv * group)
      return shape_error(*this, ("q heads must be " + std::to_string(group) + " x the kv heads").c_str(), k, "k");
    std::vector<int64_t> q_begin, q_len, kv_len, kv_begin;
    TensorView table{};
    int64_t covered = q.shape[0];  // q rows some request owns
    switch (form) {
      case AttentionForm::prefill:
      case AttentionForm::decode: {
        const bool dec = form == AttentionForm::decode;
        if (k.shape[0] != q.shape[0]) return shape_error(*this, "k must have q's batch", k, "k");
        if (!dec && k.shape[1] != q.shape[1]) return shape_error(*this, "k must have q's sequence length", k, "k");
        if (dec && k.shape[1] == 0) return shape_error(*this, "the cache must hold at least one position", k, "k");
        a.batch = q.shape[0];
        for (int64_t b = 0; b < a.batch; ++b) {
          const int64_t s = dec ? 1 : q.shape[1], n = k.shape[1];
          q_begin.push_back(b * s);
          q_len.push_back(s);
          kv_begin.push_back(b * n);
          kv_len.push_back(n);
        }
        break;
      }
      case AttentionForm::varlen: {
        TensorView cq, ck;
        if (!read_index(*this, args[3], cq, "cu_seqlens_q", 1) || !read_index(*this, args[4], ck, "cu_seqlens_k", 1))
          return nullptr;
        if (ck.shape[0] != cq.shape[0])
          return shape_error(*this, "cu_seqlens_k must have cu_seqlens_q's length", ck, "cu_seqlens_k");
        if (!check_offsets(*this, cq, q.shape[0], padded_rows, "cu_seqlens_q") ||
            !check_offsets(*this, ck, k.shape[0], padded_rows, "cu_seqlens_k"))
          return nullptr;
        const auto* cuq = static_cast<const int32_t*>(cq.data);
        const auto* cuk = static_cast<const int32_t*>(ck.data);
        a.batch = cq.shape[0] - 1;
        covered = cuq[a.batch];
        for (int64_t b = 0; b < a.batch; ++b) {
          q_begin.push_back(cuq[b]);
          q_len.push_back(cuq[b + 1] - cuq[b]);
          kv_begin.push_back(cuk[b]);
          kv_len.push_back(cuk[b + 1] - cuk[b]);
        }
        break;
      }
      case AttentionForm::paged_prefill:
      case AttentionForm::paged_decode: {
        const bool pre = form == AttentionForm::paged_prefill;
        TensorView lens;
        if (!read_index(*this, args[pre ? 8 : 3], lens, pre ? "cache_seqlens" : "real_seqlen_kv", 1) ||
            !read_index(*this, args[pre ? 9 : 4], table, "block_table", 2))
          return nullptr;
        if (k.shape[0] % page_size != 0)
          return shape_error(*this, ("the cache must hold whole pages of " + std::to_string(page_size)).c_str(), k,
                             "k");
        a.batch = pre ? 0 : q.shape[0];
        std::vector<int64_t> begins;
        if (pre) {
          TensorView cq;
          if (!read_index(*this, args[7], cq, "cu_seqlens_q", 1) ||
              !check_offsets(*this, cq, q.shape[0], false, "cu_seqlens_q"))
            return nullptr;
          a.batch = cq.shape[0] - 1;
          for (int64_t b = 0; b <= a.batch; ++b) begins.push_back(static_cast<const int32_t*>(cq.data)[b]);
        }
        if (lens.shape[0] != a.batch || table.shape[0] != a.batch)
          return shape_error(*this, "expected one length and one block_table row per request", table, "block_table");
        const auto* n = static_cast<const int32_t*>(lens.data);
        for (int64_t b = 0; b < a.batch; ++b) {
          const int64_t chunk = pre ? begins[b + 1] - begins[b] : 1;
          if (n[b] < 0)
            return value_error(*this,
                               "request " + std::to_string(b) + " has a negative length " + std::to_string(n[b]));
          q_begin.push_back(pre ? begins[b] : b);
          q_len.push_back(chunk);
          kv_len.push_back(pre ? n[b] + chunk : n[b]);
        }
        if (!check_pages(*this, table, kv_len, page_size, k.shape[0] / page_size)) return nullptr;
        a.block_table = static_cast<const int32_t*>(table.data);
        a.table_stride = table.shape[1];
        a.page_size = page_size;
        break;
      }
    }
    a.q_begin = q_begin.data();
    a.q_len = q_len.data();
    a.kv_len = kv_len.data();
    a.kv_begin = paged ? nullptr : kv_begin.data();
    for (int64_t b = 0; b < a.batch; ++b) a.max_q_len = std::max(a.max_q_len, q_len[b]);
    if (form == AttentionForm::paged_prefill && !append(args, q, a)) return nullptr;
    PyObject* out = new_tensor(q.ndim, q.shape, dtype, &a.o);
    if (out == nullptr) return nullptr;
    const int64_t row_bytes = q.numel / std::max<int64_t>(q.shape[0], 1) * dtype_size(dtype);
    if (rows_q && covered < q.shape[0])
      std::memset(static_cast<char*>(a.o) + covered * row_bytes, 0, (q.shape[0] - covered) * row_bytes);
    // Decode's kernel streams each request's keys once; a paged prefill whose chunks are all
    // one token (a decode step that appends its own token) is that case too.
    bool one_query_each = form == AttentionForm::decode || form == AttentionForm::paged_decode;
    if (form == AttentionForm::paged_prefill)
      one_query_each = a.batch > 0 && std::all_of(q_len.begin(), q_len.end(), [](int64_t n) { return n == 1; });
    int64_t keys = 0;
    for (int64_t b = 0; b < a.batch; ++b) keys += kv_len[b] * q_len[b];
    if (q.numel > 0) run_released(keys * a.heads * head_dim, [&] { (one_query_each ? decode : prefill)(a, threads); });
    return out;
  }

  // Paged prefill writes the chunk's keys and values into the cache at positions
  // cache_seqlens[b] + i, before attending (the attention then reads them from there).
  bool append(PyObject* const* args, const TensorView& q, const AttentionArgs& a) {
    TensorView kn, vn;
    if (!read(*this, args[1], kn, "k_new") || !read(*this, args[2], vn, "v_new")) return false;
    for (int d = 0; d < 3; ++d)
      if (kn.ndim != 3 || vn.ndim != 3 ||
          kn.shape[d] != (d == 0   ? q.shape[0]
                          : d == 1 ? a.heads_kv
                                   : head_dim) ||
          vn.shape[d] != kn.shape[d])
        return shape_error(*this, "k_new and v_new must be [total_q, H_kv, D]", kn, "k_new"), false;
    const int64_t row_bytes = a.heads_kv * head_dim * dtype_size(dtype);
    for (int64_t b = 0; b < a.batch; ++b) {
      const int64_t cached = a.kv_len[b] - a.q_len[b];
      for (int64_t i = 0; i < a.q_len[b]; ++i) {
        const int64_t t = cached + i, page = a.block_table[b * a.table_stride + t / a.page_size];
        const int64_t dst = (page * a.page_size + t % a.page_size) * row_bytes, src = (a.q_begin[b] + i) * row_bytes;
        std::memcpy(static_cast<char*>(const_cast<void*>(a.k)) + dst, static_cast<const char*>(kn.data) + src,
                    static_cast<size_t>(row_bytes));
        std::memcpy(static_cast<char*>(const_cast<void*>(a.v)) + dst, static_cast<const char*>(vn.data) + src,
                    static_cast<size_t>(row_bytes));
      }
    }
    return true;
  }
};

}  // namespace

void bind_attention(nb::module_& m) {
  nb::enum_<AttentionForm>(m, "AttentionForm")
      .value("prefill", AttentionForm::prefill)
      .value("decode", AttentionForm::decode)
      .value("varlen", AttentionForm::varlen)
      .value("paged_prefill", AttentionForm::paged_prefill)
      .value("paged_decode", AttentionForm::paged_decode);
  m.def("attention", [](DType dtype, AttentionForm form, bool causal, int64_t head_dim, int64_t group,
                        int64_t window_left, int64_t window_right, float scale, float softcap, int64_t page_size,
                        bool padded_rows, int slots, int threads, const std::string& d) {
    if (head_dim <= 0 || group <= 0) throw nb::value_error("attention: head_dim and group must be positive");
    if (window_left < -1 || window_right < -1) throw nb::value_error("attention: a window is -1 (off) or >= 0");
    if ((form == AttentionForm::paged_prefill || form == AttentionForm::paged_decode) && page_size <= 0)
      throw nb::value_error("attention: a paged cache needs page_size > 0");
    auto k = std::make_unique<AttentionKernel>();
    const int want = form == AttentionForm::paged_prefill ? 10
                     : form == AttentionForm::varlen      ? (slots == 8 ? 8 : 5)
                                                          : (form == AttentionForm::paged_decode ? 5 : 3);
    if (slots != want) throw nb::value_error("attention: this form takes a different number of input slots");
    k->form = form;
    k->slots = slots;
    k->causal = causal;
    k->head_dim = head_dim;
    k->group = group;
    k->window_left = window_left;
    k->window_right = window_right;
    k->scale = scale;
    k->softcap = softcap;
    k->page_size = page_size;
    k->padded_rows = padded_rows;
    k->prefill = require_kernel<AttentionArgs>("attention", dtype);
    k->decode = require_kernel<AttentionArgs>("attention_decode", dtype);
    return finish(std::move(k), dtype, threads, d);
  });
}

}  // namespace tnc
