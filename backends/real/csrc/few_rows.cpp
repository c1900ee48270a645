// Few-row fp32 products that read each weight once: the weight is packed in tiles of 16 outputs
// ([out/16][in][16], contiguous per tile), and every tile serves all rows while it sits in L1/L2.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

constexpr int64_t TILE = 16;
// k steps per chunk (16 KiB of a tile) and how far ahead to prefetch.
constexpr int64_t KCHUNK = 256;
constexpr int64_t PREFETCH = 16;

// R rows of x times one packed tile -> 16 outputs per row. Fewer than 4 rows split the k loop over
// 4 / R accumulator sets, so 8 FMA chains hide the FMA latency (4 cycles on 2 ports).
template <int R>
inline void tile_rows(const float* x, int64_t in, int64_t k0, int64_t k1, const float* tile, float* out,
                      int64_t ldo, int64_t cols) {
  constexpr int U = R >= 4 ? 1 : (R == 3 ? 1 : 4 / R);
  __m256 acc[U][R][2];
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < R; ++r) acc[u][r][0] = acc[u][r][1] = _mm256_setzero_ps();
  int64_t k = k0;
  for (; k + U <= k1; k += U) {
    _mm_prefetch(reinterpret_cast<const char*>(tile + (k + PREFETCH) * TILE), _MM_HINT_T0);
    for (int u = 0; u < U; ++u) {
      const __m256 w0 = _mm256_loadu_ps(tile + (k + u) * TILE);
      const __m256 w1 = _mm256_loadu_ps(tile + (k + u) * TILE + 8);
      for (int r = 0; r < R; ++r) {
        const __m256 b = _mm256_broadcast_ss(x + r * in + k + u);
        acc[u][r][0] = _mm256_fmadd_ps(b, w0, acc[u][r][0]);
        acc[u][r][1] = _mm256_fmadd_ps(b, w1, acc[u][r][1]);
      }
    }
  }
  for (; k < k1; ++k) {
    const __m256 w0 = _mm256_loadu_ps(tile + k * TILE);
    const __m256 w1 = _mm256_loadu_ps(tile + k * TILE + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 b = _mm256_broadcast_ss(x + r * in + k);
      acc[0][r][0] = _mm256_fmadd_ps(b, w0, acc[0][r][0]);
      acc[0][r][1] = _mm256_fmadd_ps(b, w1, acc[0][r][1]);
    }
  }
  for (int u = 1; u < U; ++u)
    for (int r = 0; r < R; ++r) {
      acc[0][r][0] = _mm256_add_ps(acc[0][r][0], acc[u][r][0]);
      acc[0][r][1] = _mm256_add_ps(acc[0][r][1], acc[u][r][1]);
    }
  // out is a [rows, 16] scratch tile; later k chunks add to it.
  for (int r = 0; r < R; ++r) {
    float* o = out + r * TILE;
    if (k0 > 0) {
      acc[0][r][0] = _mm256_add_ps(acc[0][r][0], _mm256_loadu_ps(o));
      acc[0][r][1] = _mm256_add_ps(acc[0][r][1], _mm256_loadu_ps(o + 8));
    }
    _mm256_storeu_ps(o, acc[0][r][0]);
    _mm256_storeu_ps(o + 8, acc[0][r][1]);
  }
}

// All rows times one tile, k in chunks of KCHUNK so the chunk of the tile stays in L1 across row groups.
void rows_by_tile(const float* x, int64_t rows, int64_t in, const float* tile, float* out, int64_t ldo,
                  int64_t cols, float* scratch) {
  for (int64_t k0 = 0; k0 < in; k0 += KCHUNK) {
    const int64_t k1 = std::min(in, k0 + KCHUNK);
    int64_t r = 0;
    // Groups of 4 rows keep 8 accumulators, 2 weight vectors and a broadcast in AVX2's 16 registers.
    for (; r + 4 <= rows; r += 4) tile_rows<4>(x + r * in, in, k0, k1, tile, scratch + r * TILE, ldo, cols);
    switch (rows - r) {
      case 3: tile_rows<3>(x + r * in, in, k0, k1, tile, scratch + r * TILE, ldo, cols); break;
      case 2: tile_rows<2>(x + r * in, in, k0, k1, tile, scratch + r * TILE, ldo, cols); break;
      case 1: tile_rows<1>(x + r * in, in, k0, k1, tile, scratch + r * TILE, ldo, cols); break;
      default: break;
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * ldo + c] = scratch[r * TILE + c];
}

}  // namespace

// weight [out, in] -> [ceil(out/16), in, 16], zero-padded.
torch::Tensor pack(torch::Tensor weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kFloat32, "pack: a 2-D fp32 weight");
  const int64_t out = weight.size(0), in = weight.size(1), tiles = (out + TILE - 1) / TILE;
  auto padded = torch::zeros({tiles * TILE, in}, weight.options());
  padded.narrow(0, 0, out).copy_(weight);
  return padded.view({tiles, TILE, in}).transpose(1, 2).contiguous();
}

// x [rows, in] times the packed weight -> [rows, out].
torch::Tensor mm(torch::Tensor x, torch::Tensor packed, int64_t out) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "mm: 2-D fp32 rows");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == TILE && packed.size(1) == x.size(1), "mm: a packed weight");
  x = x.contiguous();
  const int64_t rows = x.size(0), in = x.size(1), tiles = packed.size(0);
  auto y = torch::empty({rows, out}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  TORCH_CHECK(rows <= 64, "mm: at most 64 rows");
  at::parallel_for(0, tiles, 8, [&](int64_t t0, int64_t t1) {
    alignas(32) float scratch[64 * TILE];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t c0 = t * TILE;
      rows_by_tile(xp, rows, in, wp + t * in * TILE, yp + c0, out, std::min(TILE, out - c0), scratch);
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "weight [out, in] -> tiles of 16 outputs");
  m.def("mm", &mm, "few rows times a packed weight");
}
