// CPU fused attention (the "sdpa" attention function on CPU): forward and backward that never hold
// more than one row of scores.
//
// Forward: per query row, the visible keys are visited in blocks of kKeyBlock with an online
// softmax (running max and sum, the accumulator rescaled when the max grows), so memory is
// O(rows·D), never O(S·T). Numerics follow the flash kernels: scores and softmax in f32 (f64 for
// f64 inputs), the probabilities rounded to q's dtype before they weight V while the sum they are
// normalised by is the unrounded one, lse = max + log(sum) (+∞ for a fully masked row, whose
// output is 0). Backward: with the forward's lse, each (query, key) pair recomputes its
// probability, dP = dO·v, dS = P·(dP − Σ dO·O) (·(1 − tanh²) under softcap), and accumulates
// dq, dk (·scale) and dv in the compute type, rounded once when stored. Masks, softcap, window,
// key_start and varlen as in hk/layer_interfaces.h (attention@1, attention_varlen@1).
// Plain loops over contiguous copies (ops/cpu_util.h), single-threaded: a correct reference
// that scales, not a tuned kernel.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "hk/error.h"
#include "ops/attention_fused.h"
#include "ops/cpu_util.h"

namespace hk::ops::cpu {
namespace {

constexpr int64_t kKeyBlock = 64;

// One sequence's geometry and its rows in the loaded [rows, H, D] buffers.
struct Seq {
  int64_t q_row0, k_row0, S, T, key_start;
};

struct Layout {
  bool varlen;
  int64_t batch, hq, hkv, d, group;
  int64_t S, T;  // batch layout
  std::vector<int64_t> cu_q, cu_k, key_start;

  Layout(const TensorView& q, const TensorView& k, const FusedAttentionOptions& o)
      : varlen(o.cu_seqlens_q != nullptr) {
    const int r = varlen ? 1 : 2;
    hq = q.shape[r];
    hkv = k.shape[r];
    d = q.shape[r + 1];
    group = hq / hkv;
    if (varlen) {
      cu_q = load_ints(*o.cu_seqlens_q);
      cu_k = load_ints(*o.cu_seqlens_k);
      batch = static_cast<int64_t>(cu_q.size()) - 1;
      S = T = 0;
      for (int64_t b = 0; b < batch; ++b)
        if (cu_q[b + 1] < cu_q[b] || cu_k[b + 1] < cu_k[b] || cu_q[b + 1] > q.shape[0] ||
            cu_k[b + 1] > k.shape[0] || cu_q[0] != 0 || cu_k[0] != 0)
          throw InvalidArgument(
              "fused_attention: cu_seqlens must start at 0, never decrease and stay within the "
              "packed rows");
    } else {
      batch = q.shape[0];
      S = q.shape[1];
      T = k.shape[1];
    }
    if (o.key_start) key_start = load_ints(*o.key_start);
  }
  Seq seq(int64_t b) const {
    Seq s;
    if (varlen) {
      s.q_row0 = cu_q[b];
      s.k_row0 = cu_k[b];
      s.S = cu_q[b + 1] - cu_q[b];
      s.T = cu_k[b + 1] - cu_k[b];
    } else {
      s.q_row0 = b * S;
      s.k_row0 = b * T;
      s.S = S;
      s.T = T;
    }
    s.key_start = key_start.empty() ? 0 : std::clamp<int64_t>(key_start[b], 0, s.T);
    return s;
  }
};

// Visible keys [lo, hi) of query s.
struct Range {
  int64_t lo, hi;
};
Range visible(const Seq& sq, int64_t s, const FusedAttentionOptions& o) {
  const int64_t diag = s + sq.T - sq.S;
  int64_t hi = o.causal ? std::min(sq.T, diag + 1) : sq.T;
  int64_t lo = sq.key_start;
  if (o.window_left >= 0) lo = std::max(lo, diag - o.window_left);
  return {lo, std::max(lo, hi)};
}

template <class T>
struct Scores {
  T scale, cap;
  // softcap'd score and the tanh it used (0 without softcap)
  T operator()(T dot, T* th) const {
    const T s = dot * scale;
    if (cap <= T(0)) {
      *th = T(0);
      return s;
    }
    *th = std::tanh(s / cap);
    return cap * *th;
  }
};
template <class T>
Scores<T> scores(const FusedAttentionOptions& o, int64_t d) {
  return {o.scale != 0.0f ? static_cast<T>(o.scale) : T(1) / std::sqrt(static_cast<T>(d)),
          static_cast<T>(o.softcap)};
}

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  T acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

template <class T>
void forward_t(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const FusedAttentionOptions& o, const TensorView* lse) {
  const Layout L(q, k, o);
  const std::vector<T> qs = load<T>(q), ks = load<T>(k), vs = load<T>(v);
  std::vector<T> os(qs.size(), T(0));
  const int64_t lse_rows = L.varlen ? q.shape[0] : L.batch * L.S;
  std::vector<T> lses(static_cast<size_t>(lse_rows * L.hq), T(0));
  const Scores<T> sc = scores<T>(o, L.d);
  const int64_t d = L.d;
  std::vector<T> acc(static_cast<size_t>(d)), block(kKeyBlock);
  for (int64_t b = 0; b < L.batch; ++b) {
    const Seq sq = L.seq(b);
    for (int64_t h = 0; h < L.hq; ++h) {
      const int64_t hk = h / L.group;
      for (int64_t s = 0; s < sq.S; ++s) {
        const T* qr = &qs[((sq.q_row0 + s) * L.hq + h) * d];
        const Range r = visible(sq, s, o);
        T m = -std::numeric_limits<T>::infinity(), l = 0;
        std::fill(acc.begin(), acc.end(), T(0));
        for (int64_t j0 = r.lo; j0 < r.hi; j0 += kKeyBlock) {
          const int64_t n = std::min(kKeyBlock, r.hi - j0);
          T bmax = -std::numeric_limits<T>::infinity();
          for (int64_t j = 0; j < n; ++j) {
            T th;
            block[j] = sc(dot(qr, &ks[((sq.k_row0 + j0 + j) * L.hkv + hk) * d], d), &th);
            bmax = std::max(bmax, block[j]);
          }
          const T m_new = std::max(m, bmax);
          const T alpha = std::exp(m - m_new);  // m = -inf → 0
          l *= alpha;
          for (int64_t e = 0; e < d; ++e) acc[e] *= alpha;
          for (int64_t j = 0; j < n; ++j) {
            const T p = std::exp(block[j] - m_new);
            l += p;
            const T pr = round_as(q.dtype, p);
            const T* vr = &vs[((sq.k_row0 + j0 + j) * L.hkv + hk) * d];
            for (int64_t e = 0; e < d; ++e) acc[e] += pr * vr[e];
          }
          m = m_new;
        }
        T* orow = &os[((sq.q_row0 + s) * L.hq + h) * d];
        const T inv = l > T(0) ? T(1) / l : T(0);
        for (int64_t e = 0; e < d; ++e) orow[e] = acc[e] * inv;
        const int64_t li = L.varlen ? h * lse_rows + sq.q_row0 + s : (b * L.hq + h) * L.S + s;
        lses[li] = l > T(0) ? m + std::log(l) : std::numeric_limits<T>::infinity();
      }
    }
  }
  store(out, os);
  if (lse) store(*lse, lses);
}

template <class T>
void backward_t(const TensorView& dout, const TensorView& q, const TensorView& k,
                const TensorView& v, const TensorView& out, const TensorView& lse,
                const TensorView& dq, const TensorView& dk, const TensorView& dv,
                const FusedAttentionOptions& o) {
  const Layout L(q, k, o);
  const std::vector<T> qs = load<T>(q), ks = load<T>(k), vs = load<T>(v), os = load<T>(out),
                       dos = load<T>(dout), lses = load<T>(lse);
  std::vector<T> dqs(qs.size(), T(0)), dks(ks.size(), T(0)), dvs(vs.size(), T(0));
  const Scores<T> sc = scores<T>(o, L.d);
  const int64_t d = L.d;
  const int64_t lse_rows = L.varlen ? q.shape[0] : L.batch * L.S;
  for (int64_t b = 0; b < L.batch; ++b) {
    const Seq sq = L.seq(b);
    for (int64_t h = 0; h < L.hq; ++h) {
      const int64_t hk = h / L.group;
      for (int64_t s = 0; s < sq.S; ++s) {
        const int64_t qi = ((sq.q_row0 + s) * L.hq + h) * d;
        const int64_t li = L.varlen ? h * lse_rows + sq.q_row0 + s : (b * L.hq + h) * L.S + s;
        const T row_lse = lses[li];
        if (!std::isfinite(row_lse)) continue;  // fully masked row: no gradient
        const T di = dot(&dos[qi], &os[qi], d);
        const Range r = visible(sq, s, o);
        for (int64_t j = r.lo; j < r.hi; ++j) {
          const int64_t kj = ((sq.k_row0 + j) * L.hkv + hk) * d;
          T th;
          const T p = std::exp(sc(dot(&qs[qi], &ks[kj], d), &th) - row_lse);
          const T dp = dot(&dos[qi], &vs[kj], d);
          T ds = p * (dp - di);
          if (sc.cap > T(0)) ds *= T(1) - th * th;
          ds *= sc.scale;
          for (int64_t e = 0; e < d; ++e) {
            dvs[kj + e] += p * dos[qi + e];
            dqs[qi + e] += ds * ks[kj + e];
            dks[kj + e] += ds * qs[qi + e];
          }
        }
      }
    }
  }
  store(dq, dqs);
  store(dk, dks);
  store(dv, dvs);
}

}  // namespace

void fused_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const FusedAttentionOptions& options,
                     const TensorView* lse, Stream) {
  if (q.dtype == DType::F64)
    forward_t<double>(q, k, v, out, options, lse);
  else
    forward_t<float>(q, k, v, out, options, lse);
}

void fused_attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                              const TensorView& v, const TensorView& out, const TensorView& lse,
                              const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const FusedAttentionOptions& options, Stream) {
  if (q.dtype == DType::F64)
    backward_t<double>(dout, q, k, v, out, lse, dq, dk, dv, options);
  else
    backward_t<float>(dout, q, k, v, out, lse, dq, dk, dv, options);
}

}  // namespace hk::ops::cpu
