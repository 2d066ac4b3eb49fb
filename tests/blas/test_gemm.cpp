// Tests for blas/gemm.hpp on the host: every transpose combination, odd sizes (1, 7, 129, 1000),
// beta != 0, padded rows, f16/bf16 operands and outputs, the fused epilogues, batched views,
// bitwise determinism across thread counts, both micro-kernels, the CBLAS backend, and errors,
// all against a float64 reference (tests/blas/gemm_reference.hpp).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <trainkit/blas/gemm.hpp>
#include <trainkit/exec/host.hpp>

#include "blas/gemm_reference.hpp"

namespace {

using namespace gemm_test;
using trainkit::HostView;
using trainkit::blas::GemmOptions;
using trainkit::blas::HostBackend;
namespace blas = trainkit::blas;
namespace exec = trainkit::exec;

constexpr Op kOps[] = {Op::kN, Op::kT};

struct Case {
  std::int64_t m, n, k;
};

// Runs one host gemm (with padded operands) against the reference; returns the relative error.
template <class TA, class TB, class TC>
double run_case(const exec::Host& host, Op op_a, Op op_b, const Case& cs, float alpha, float beta,
                std::uint64_t seed, HostBackend backend = HostBackend::kAuto) {
  Matrix<TA> a(stored_rows(op_a, cs.m, cs.k), stored_cols(op_a, cs.m, cs.k), 3);
  Matrix<TB> b(stored_rows(op_b, cs.k, cs.n), stored_cols(op_b, cs.k, cs.n), 5);
  Matrix<TC> c(cs.m, cs.n, 2);
  a.fill_random(seed);
  b.fill_random(seed + 1);
  if (beta != 0.0f) {
    c.fill_random(seed + 2);
  } else {
    c.fill(std::numeric_limits<double>::quiet_NaN());  // beta == 0: C must not be read
  }
  const Reference ref = reference_gemm(op_a, op_b, a, b, c, alpha, beta, Epilogue::kNone);
  blas::gemm(host, op_a, op_b, a.cview(), b.cview(), c.view(),
             {.alpha = alpha, .beta = beta, .host_backend = backend});
  CHECK(padding_untouched(c));
  return rel_error(c, ref.out, cs.m, cs.n);
}

}  // namespace

TEST_CASE("host gemm f32: transposes x odd sizes x beta x padded rows vs float64") {
  exec::Host host(2);
  const Case cases[] = {{1, 1, 1},       {7, 7, 7},      {1, 129, 7},
                        {129, 1, 1000},  {1000, 7, 129}, {7, 1000, 1},
                        {129, 129, 129}, {33, 17, 1000}, {257, 300, 513}};
  std::uint64_t seed = 1;
  for (const Case& cs : cases)
    for (Op op_a : kOps)
      for (Op op_b : kOps)
        for (float beta : {0.0f, 0.75f}) {
          const float alpha = beta == 0.0f ? 1.0f : -1.5f;
          const double err =
              run_case<float, float, float>(host, op_a, op_b, cs, alpha, beta, seed++);
          INFO("m=", cs.m, " n=", cs.n, " k=", cs.k, " op_a=", std::string(blas::to_string(op_a)),
               " op_b=", std::string(blas::to_string(op_b)), " beta=", beta);
          CHECK(err < 1e-5);
        }
}

TEST_CASE("host gemm: both micro-kernels agree with float64, epilogues included") {
  // The CPU picks one kernel; run the portable one explicitly so both are covered everywhere.
  // 37 x 45: partial register tiles in both directions (6 x 16 tiles).
  const Case cs{37, 45, 300};
  Matrix<float> a(cs.m, cs.k, 1), b(cs.n, cs.k, 0), c(cs.m, cs.n, 4), pre(cs.m, cs.n, 3);
  a.fill_random(11);
  b.fill_random(12);
  c.fill_random(13);
  pre.fill_random(14, -3.0, 3.0);
  std::vector<float> bias(cs.n);
  std::vector<double> bias_d(cs.n);
  for (std::int64_t j = 0; j < cs.n; ++j) bias_d[j] = bias[j] = 0.02f * float(j % 11) - 0.1f;
  // GeluAux::kSlope: the forward keeps gelu'(v) in aux, and the backward is handed that slope.
  Matrix<float> slope_of_pre = pre;
  for (std::int64_t i = 0; i < cs.m; ++i)
    for (std::int64_t j = 0; j < cs.n; ++j)
      slope_of_pre.at(i, j) = blas::gelu_tanh_grad(pre.at(i, j));
  for (const bool slope : {false, true}) {
    for (Epilogue e : {Epilogue::kNone, Epilogue::kBias, Epilogue::kBiasGelu, Epilogue::kDGelu}) {
      if (slope && (e == Epilogue::kNone || e == Epilogue::kBias)) continue;
      const Reference ref = reference_gemm(Op::kN, Op::kT, a, b, c, 0.5, 2.0, e, bias_d, &pre);
      std::vector<double> ref_slope(ref.aux.size());
      for (std::size_t i = 0; i < ref.aux.size(); ++i) ref_slope[i] = gelu_grad_ref(ref.aux[i]);
      for (const blas::detail::GemmKernel* kernel : blas::detail::gemm_kernels_for_this_cpu()) {
        INFO("epilogue ", std::string(blas::to_string(e)), ", kernel ", std::string(kernel->name),
             slope ? ", aux holds the slope" : "");
        Matrix<float> got = c;
        Matrix<float> aux =
            e == Epilogue::kDGelu ? (slope ? slope_of_pre : pre) : Matrix<float>(cs.m, cs.n, 3);
        blas::detail::GemmOutput<float> out{
            got.data.data(),
            got.ld,
            0.5f,
            2.0f,
            e,
            bias.data(),
            e == Epilogue::kNone || e == Epilogue::kBias ? nullptr : aux.data.data(),
            aux.ld};
        out.aux_slope = slope;
        exec::Host host(2);
        blas::detail::host_gemm_2d(
            &host, {cs.m, cs.n, cs.k}, blas::detail::OperandRef<float>{a.data.data(), a.ld, 1},
            blas::detail::OperandRef<float>{b.data.data(), 1, b.ld}, out, *kernel);
        CHECK(rel_error(got, ref.out, cs.m, cs.n) < 1e-5);
        CHECK(padding_untouched(got));
        if (e == Epilogue::kBiasGelu) {
          CHECK(rel_error(aux, slope ? ref_slope : ref.aux, cs.m, cs.n) < 1e-5);
          CHECK(padding_untouched(aux));
        }
      }
    }
  }
  MESSAGE("micro-kernel on this CPU: ", std::string(blas::detail::gemm_kernel_name()));
}

TEST_CASE("host gemm: every vector micro-kernel gives the same bits, random shapes") {
  // Each element of C is one chain of fused multiply-adds over k in a fixed order, whatever the
  // register tile, so AVX2 (6 x 16) and AVX-512 (12 x 32) agree bit for bit: A read in place in
  // either layout, packed tails in m, masked tails in n, several k blocks, beta, epilogues.
  std::vector<const blas::detail::GemmKernel*> simd;
  for (const blas::detail::GemmKernel* k : blas::detail::gemm_kernels_for_this_cpu())
    if (k != &blas::detail::kGemmPortable) simd.push_back(k);
  if (simd.size() < 2) {
    MESSAGE("fewer than two vector micro-kernels on this CPU; nothing to compare");
    return;
  }
  std::mt19937_64 rng(2026);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  const Epilogue epilogues[] = {Epilogue::kNone, Epilogue::kBias, Epilogue::kBiasGelu,
                                Epilogue::kDGelu};
  for (int trial = 0; trial < 40; ++trial) {
    const Case cs{pick(1, 80), pick(1, 90), trial % 5 == 0 ? pick(385, 900) : pick(1, 200)};
    const Op op_a = kOps[pick(0, 1)], op_b = kOps[pick(0, 1)];
    const Epilogue e = epilogues[pick(0, 3)];
    const float beta = trial % 3 == 0 ? 0.5f : 0.0f;
    const float alpha = pick(0, 1) == 0 ? 1.0f : 1.25f;  // 1: the kernels skip the scaling
    Matrix<float> a(stored_rows(op_a, cs.m, cs.k), stored_cols(op_a, cs.m, cs.k), pick(0, 3));
    Matrix<float> b(stored_rows(op_b, cs.k, cs.n), stored_cols(op_b, cs.k, cs.n), pick(0, 3));
    Matrix<float> c0(cs.m, cs.n, 1), pre(cs.m, cs.n, 2);
    a.fill_random(100 + trial);
    b.fill_random(200 + trial);
    c0.fill_random(300 + trial);
    pre.fill_random(400 + trial, -4.0, 4.0);
    std::vector<float> bias(static_cast<std::size_t>(cs.n));
    for (float& v : bias) v = static_cast<float>(pick(-50, 50)) * 0.01f;
    std::vector<Matrix<float>> outs, auxes;
    for (const blas::detail::GemmKernel* kernel : simd) {
      Matrix<float> c = c0;
      Matrix<float> aux = e == Epilogue::kDGelu ? pre : Matrix<float>(cs.m, cs.n, 2);
      blas::detail::GemmOutput<float> out{
          c.data.data(),
          c.ld,
          alpha,
          beta,
          e,
          bias.data(),
          e == Epilogue::kNone || e == Epilogue::kBias ? nullptr : aux.data.data(),
          aux.ld};
      out.aux_slope = trial % 4 >= 2;  // GeluAux::kSlope (aux then holds or gets a slope)
      exec::Host host(trial % 2 + 1);
      blas::detail::host_gemm_2d(&host, {cs.m, cs.n, cs.k},
                                 blas::detail::operand_ref<float>(op_a, a.cview()),
                                 blas::detail::operand_ref<float>(op_b, b.cview()), out, *kernel);
      outs.push_back(std::move(c));
      auxes.push_back(std::move(aux));
    }
    for (std::size_t i = 1; i < simd.size(); ++i) {
      INFO("trial ", trial, ": m=", cs.m, " n=", cs.n, " k=", cs.k,
           " op_a=", std::string(blas::to_string(op_a)),
           " op_b=", std::string(blas::to_string(op_b)), " epilogue ",
           std::string(blas::to_string(e)), ", ", std::string(simd[i]->name), " vs ",
           std::string(simd[0]->name));
      CHECK(std::memcmp(outs[i].data.data(), outs[0].data.data(),
                        outs[0].data.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(auxes[i].data.data(), auxes[0].data.data(),
                        auxes[0].data.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("host gemm: the vector micro-kernels give the bits of one fused multiply-add chain") {
  // What every kernel computes for an element of C, written as scalar code: per k block a chain
  // of fused multiply-adds over k ascending, times alpha (skipped at 1), + beta * the rows beta
  // multiplies (C itself after the first block), and on the last block + bias (+ 0 without one)
  // and times the saved GELU slope. The epilogues without an exponential, so this holds on any
  // CPU, including one with a single vector kernel; random shapes, both layouts of A (read in
  // place or packed), packed and partial tiles, several k blocks.
  std::mt19937_64 rng(77);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  const auto mul = [](float x, float y) {  // one rounding: never contracted with a later add
    volatile float product = x * y;
    return static_cast<float>(product);
  };
  for (const blas::detail::GemmKernel* kernel : blas::detail::gemm_kernels_for_this_cpu()) {
    if (kernel == &blas::detail::kGemmPortable) continue;
    for (int trial = 0; trial < 30; ++trial) {
      const Case cs{pick(1, 70), pick(1, 70), trial % 4 == 0 ? pick(385, 1000) : pick(1, 160)};
      const Op op_a = kOps[pick(0, 1)], op_b = kOps[pick(0, 1)];
      const int kind = static_cast<int>(pick(0, 2));  // none, bias, dGELU from the slope
      const Epilogue e =
          kind == 0 ? Epilogue::kNone : (kind == 1 ? Epilogue::kBias : Epilogue::kDGelu);
      const float alpha = pick(0, 1) == 0 ? 1.0f : 0.75f;
      const float beta = pick(0, 2) == 0 ? 0.0f : 1.5f;
      const bool use_c_in = beta != 0.0f && pick(0, 1) == 1;
      Matrix<float> a(stored_rows(op_a, cs.m, cs.k), stored_cols(op_a, cs.m, cs.k), pick(0, 3));
      Matrix<float> b(stored_rows(op_b, cs.k, cs.n), stored_cols(op_b, cs.k, cs.n), pick(0, 3));
      Matrix<float> c(cs.m, cs.n, 1), c_in(cs.m, cs.n, 1), slope(cs.m, cs.n, 2);
      a.fill_random(10 + trial);
      b.fill_random(20 + trial);
      c.fill_random(30 + trial);
      c_in.fill_random(40 + trial);
      slope.fill_random(50 + trial, -0.2, 1.1);
      std::vector<float> bias(static_cast<std::size_t>(cs.n));
      for (float& v : bias) v = static_cast<float>(pick(-50, 50)) * 0.01f;
      const auto op_a_at = [&](std::int64_t i, std::int64_t p) {
        return op_a == Op::kN ? a.at(i, p) : a.at(p, i);
      };
      const auto op_b_at = [&](std::int64_t p, std::int64_t j) {
        return op_b == Op::kN ? b.at(p, j) : b.at(j, p);
      };
      // The k blocks: at most kGemmKC long, equal lengths (the last may be shorter).
      const std::int64_t blocks = (cs.k + blas::detail::kGemmKC - 1) / blas::detail::kGemmKC;
      const std::int64_t kc = (cs.k + blocks - 1) / blocks;
      Matrix<float> want = c;
      for (std::int64_t i = 0; i < cs.m; ++i) {
        for (std::int64_t j = 0; j < cs.n; ++j) {
          float v = 0.0f;
          for (std::int64_t p0 = 0; p0 < cs.k; p0 += kc) {
            float acc = 0.0f;
            for (std::int64_t p = p0; p < std::min(cs.k, p0 + kc); ++p)
              acc = std::fma(op_a_at(i, p), op_b_at(p, j), acc);
            if (alpha != 1.0f) acc = mul(alpha, acc);
            const float block_beta = p0 == 0 ? beta : 1.0f;
            const float src = p0 == 0 && use_c_in ? c_in.at(i, j) : (p0 == 0 ? c.at(i, j) : v);
            if (block_beta != 0.0f) acc = std::fma(block_beta, src, acc);
            v = acc;
          }
          if (e != Epilogue::kNone) v = v + (e == Epilogue::kBias ? bias[std::size_t(j)] : 0.0f);
          if (e == Epilogue::kDGelu) v = mul(v, slope.at(i, j));
          want.at(i, j) = v;
        }
      }
      blas::detail::GemmOutput<float> out{c.data.data(),
                                          c.ld,
                                          alpha,
                                          beta,
                                          e,
                                          e == Epilogue::kBias ? bias.data() : nullptr,
                                          e == Epilogue::kDGelu ? slope.data.data() : nullptr,
                                          slope.ld};
      out.aux_slope = e == Epilogue::kDGelu;
      if (use_c_in) out.c_in = c_in.data.data();
      exec::Host host(trial % 2 + 1);
      blas::detail::host_gemm_2d(&host, {cs.m, cs.n, cs.k},
                                 blas::detail::operand_ref<float>(op_a, a.cview()),
                                 blas::detail::operand_ref<float>(op_b, b.cview()), out, *kernel);
      INFO(kernel->name, " trial ", trial, ": m=", cs.m, " n=", cs.n, " k=", cs.k,
           " op_a=", std::string(blas::to_string(op_a)),
           " op_b=", std::string(blas::to_string(op_b)), " epilogue ",
           std::string(blas::to_string(e)), " alpha ", alpha, " beta ", beta, " c_in ", use_c_in);
      std::int64_t differ = 0;
      for (std::int64_t i = 0; i < cs.m; ++i)
        for (std::int64_t j = 0; j < cs.n; ++j)
          differ += std::memcmp(&want.at(i, j), &c.at(i, j), sizeof(float)) != 0;
      CHECK(differ == 0);
    }
  }
}

TEST_CASE("host gemm: a fused GELU epilogue gives the bits of the bias epilogue, then the GELU") {
  // The vector kernels run the GELU of a whole tile in passes over its vectors; that must be
  // the GELU of the vector spans (gemm_gelu_span, gemm_gelu_slope_span) applied to what the
  // bias epilogue gives, bit for bit: values, the saved input or slope, NaN and the clamps.
  std::mt19937_64 rng(91);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  for (const blas::detail::GemmKernel* kernel : blas::detail::gemm_kernels_for_this_cpu()) {
    if (kernel == &blas::detail::kGemmPortable) continue;  // its GELU is the scalar one
    for (int trial = 0; trial < 24; ++trial) {
      // n a multiple of 8, so the spans run their vector body on every element.
      const Case cs{pick(1, 40), 8 * pick(1, 9), pick(1, 300)};
      const Op op_a = kOps[pick(0, 1)], op_b = kOps[pick(0, 1)];
      const bool slope_mode = trial % 2 == 0;
      const float alpha = pick(0, 1) == 0 ? 1.0f : 2.5f;
      const float beta = pick(0, 1) == 0 ? 0.0f : 0.5f;
      Matrix<float> a(stored_rows(op_a, cs.m, cs.k), stored_cols(op_a, cs.m, cs.k), 1);
      Matrix<float> b(stored_rows(op_b, cs.k, cs.n), stored_cols(op_b, cs.k, cs.n), 2);
      Matrix<float> c0(cs.m, cs.n, 3);
      a.fill_random(500 + trial, -3.0, 3.0);
      b.fill_random(600 + trial, -3.0, 3.0);
      c0.fill_random(700 + trial, -20.0, 20.0);
      if (trial % 3 == 0) {  // NaN and values past the clamps
        a.at(0, 0) = std::numeric_limits<float>::quiet_NaN();
        c0.at(cs.m - 1, cs.n - 1) = 1e30f;
        c0.at(0, cs.n - 1) = -1e30f;
      }
      std::vector<float> bias(static_cast<std::size_t>(cs.n));
      for (float& v : bias) v = static_cast<float>(pick(-300, 300)) * 0.01f;
      const auto run = [&](Epilogue e, Matrix<float>& c, Matrix<float>* aux) {
        c = c0;
        blas::detail::GemmOutput<float> out{c.data.data(),
                                            c.ld,
                                            alpha,
                                            beta,
                                            e,
                                            bias.data(),
                                            aux == nullptr ? nullptr : aux->data.data(),
                                            aux == nullptr ? 0 : aux->ld};
        out.aux_slope = slope_mode;
        blas::detail::host_gemm_2d(nullptr, {cs.m, cs.n, cs.k},
                                   blas::detail::operand_ref<float>(op_a, a.cview()),
                                   blas::detail::operand_ref<float>(op_b, b.cview()), out, *kernel);
      };
      Matrix<float> want(cs.m, cs.n, 3), got(cs.m, cs.n, 3);
      Matrix<float> want_aux(cs.m, cs.n, 1), got_aux(cs.m, cs.n, 1);
      run(Epilogue::kBias, want, nullptr);
      for (std::int64_t i = 0; i < cs.m; ++i) {
        float* row = &want.at(i, 0);
        float* aux_row = &want_aux.at(i, 0);
        if (slope_mode) {
          blas::detail::gemm_gelu_slope_span(row, aux_row, cs.n);
        } else {
          std::memcpy(aux_row, row, static_cast<std::size_t>(cs.n) * sizeof(float));
          blas::detail::gemm_gelu_span(row, nullptr, cs.n);
        }
      }
      run(Epilogue::kBiasGelu, got, &got_aux);
      INFO(kernel->name, " trial ", trial, ": m=", cs.m, " n=", cs.n, " k=", cs.k, " slope ",
           slope_mode, " alpha ", alpha, " beta ", beta);
      std::int64_t differ = 0;
      for (std::int64_t i = 0; i < cs.m; ++i)
        for (std::int64_t j = 0; j < cs.n; ++j) {
          differ += std::memcmp(&want.at(i, j), &got.at(i, j), sizeof(float)) != 0;
          differ += std::memcmp(&want_aux.at(i, j), &got_aux.at(i, j), sizeof(float)) != 0;
        }
      CHECK(differ == 0);
    }
  }
}

TEST_CASE("host gemm band (causal attention products): the needed part of the full product") {
  // host_gemm_band computes only what a causal caller reads; there it must equal the full
  // product (same summation chains; the skipped products are the zeros of a causal operand).
  using blas::detail::GemmBand;
  std::mt19937_64 rng(77);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  for (const blas::detail::GemmKernel* kernel : blas::detail::gemm_kernels_for_this_cpu()) {
    for (int trial = 0; trial < 40; ++trial) {
      const GemmBand band = static_cast<GemmBand>(trial % 4);
      // From trial 24 on, n is whole 16-column panels (attention's widths: no partial panel).
      const bool panels = trial >= 24;
      // m up to 140: a transposed A of the sums' m x m is read in place up to 16384 elements
      // and packed beyond.
      const std::int64_t m =
          panels && band == GemmBand::kColsToRow ? 16 * pick(1, 5) : pick(1, 140);
      // Causal products are square in the masked dimension: cols (kColsToRow) or k (the sums).
      const std::int64_t n =
          band == GemmBand::kColsToRow ? m : (panels ? 16 * pick(1, 4) : pick(1, 70));
      const std::int64_t k =
          band == GemmBand::kSumToRow || band == GemmBand::kSumFromRow ? m : pick(1, 70);
      const Op op_a = kOps[pick(0, 1)], op_b = kOps[pick(0, 1)];
      Matrix<float> a(stored_rows(op_a, m, k), stored_cols(op_a, m, k), pick(0, 2));
      Matrix<float> b(stored_rows(op_b, k, n), stored_cols(op_b, k, n), pick(0, 2));
      a.fill_random(500 + trial);
      b.fill_random(600 + trial);
      // The causal zeros: op(A)[i, p] = 0 for p > i (kSumToRow) or p < i (kSumFromRow).
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t p = 0; p < k; ++p) {
          const bool zero =
              (band == GemmBand::kSumToRow && p > i) || (band == GemmBand::kSumFromRow && p < i);
          if (zero) (op_a == Op::kN ? a.at(i, p) : a.at(p, i)) = 0.0f;
        }
      Matrix<float> full(m, n, 1), part(m, n, 1);
      const blas::detail::GemmOutput<float> out{full.data.data(), full.ld, 0.75f,   0.0f,
                                                Epilogue::kNone,  nullptr, nullptr, 0};
      blas::detail::host_gemm_2d(nullptr, {m, n, k},
                                 blas::detail::operand_ref<float>(op_a, a.cview()),
                                 blas::detail::operand_ref<float>(op_b, b.cview()), out, *kernel);
      blas::detail::host_gemm_band({m, n, k}, blas::detail::operand_ref<float>(op_a, a.cview()),
                                   blas::detail::operand_ref<float>(op_b, b.cview()),
                                   part.data.data(), part.ld, 0.75f, band, *kernel);
      int wrong = 0;
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          if (band == GemmBand::kColsToRow && j > i) continue;  // not needed, may be unwritten
          wrong += part.at(i, j) == full.at(i, j) ? 0 : 1;
        }
      INFO(kernel->name, " trial ", trial, " band ", trial % 4, " m=", m, " n=", n, " k=", k);
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("host gemm: f16/bf16 operands and outputs accumulate in f32") {
  exec::Host host(2);
  const Case cs{129, 70, 300};
  for (Op op_a : kOps)
    for (Op op_b : kOps) {
      INFO("op_a=", std::string(blas::to_string(op_a)),
           " op_b=", std::string(blas::to_string(op_b)));
      // Inputs are exact in f32, so an f32 output only carries accumulation error.
      CHECK(run_case<bf16, bf16, float>(host, op_a, op_b, cs, 1.0f, 0.0f, 21) < 1e-5);
      CHECK(run_case<f16, float, float>(host, op_a, op_b, cs, 1.0f, 0.5f, 22) < 1e-5);
      // A 16-bit output is one rounding of the f32 result: bf16 ~ 2^-9, f16 ~ 2^-12 relative.
      CHECK(run_case<bf16, bf16, bf16>(host, op_a, op_b, cs, 1.0f, 0.5f, 23) < 1e-2);
      CHECK(run_case<f16, f16, f16>(host, op_a, op_b, cs, 2.0f, 0.0f, 24) < 1e-3);
      CHECK(run_case<float, bf16, f16>(host, op_a, op_b, cs, 1.0f, 0.25f, 25) < 1e-3);
    }
}

TEST_CASE("host gemm: options.c_in: beta scales c_in, C is only written, the bits of C = c_in") {
  // C starts as NaN, so a kernel that read C instead of c_in would give NaN; the result must be
  // bit for bit the one of the same call with C seeded with c_in (every kernel, random shapes,
  // transposes, epilogues, k blocks, threads; f32 C on the registers, 16-bit C through the
  // driver's row epilogue).
  std::mt19937_64 rng(77);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  const Epilogue epilogues[] = {Epilogue::kNone, Epilogue::kBias, Epilogue::kBiasGelu,
                                Epilogue::kDGelu};
  for (int trial = 0; trial < 36; ++trial) {
    const Case cs{pick(1, 70), pick(1, 80), trial % 6 == 0 ? pick(385, 800) : pick(0, 150)};
    const Op op_a = kOps[pick(0, 1)], op_b = kOps[pick(0, 1)];
    const Epilogue e = epilogues[pick(0, 3)];
    const float alpha = pick(0, 1) == 0 ? 1.0f : -0.75f;
    const float beta = pick(0, 1) == 0 ? 1.0f : 0.5f;
    Matrix<float> a(stored_rows(op_a, cs.m, cs.k), stored_cols(op_a, cs.m, cs.k), pick(0, 3));
    Matrix<float> b(stored_rows(op_b, cs.k, cs.n), stored_cols(op_b, cs.k, cs.n), pick(0, 3));
    const std::int64_t pad = pick(0, 3);
    Matrix<float> r(cs.m, cs.n, pad), pre(cs.m, cs.n);
    a.fill_random(500 + trial);
    b.fill_random(600 + trial);
    r.fill_random(700 + trial);
    pre.fill_random(800 + trial, -4.0, 4.0);
    const Matrix<float> r0 = r;
    std::vector<float> bias(static_cast<std::size_t>(cs.n));
    for (float& v : bias) v = static_cast<float>(pick(-50, 50)) * 0.01f;
    const bool slope = trial % 4 >= 2;
    INFO("trial ", trial, ": m=", cs.m, " n=", cs.n, " k=", cs.k,
         " op_a=", std::string(blas::to_string(op_a)), " op_b=", std::string(blas::to_string(op_b)),
         " epilogue ", std::string(blas::to_string(e)), " alpha ", alpha, " beta ", beta);
    const bool uses_aux = e == Epilogue::kBiasGelu || e == Epilogue::kDGelu;
    for (const blas::detail::GemmKernel* kernel : blas::detail::gemm_kernels_for_this_cpu()) {
      INFO("kernel ", std::string(kernel->name));
      Matrix<float> seeded = r, fresh(cs.m, cs.n, pad);  // fresh: NaN everywhere
      Matrix<float> aux_seeded = pre, aux_fresh = pre;
      const auto output = [&](Matrix<float>& c, Matrix<float>& aux, const float* c_in) {
        blas::detail::GemmOutput<float> out{
            c.data.data(), c.ld, alpha, beta, e, bias.data(), uses_aux ? aux.data.data() : nullptr,
            aux.ld};
        out.aux_slope = slope;
        out.c_in = c_in;
        return out;
      };
      exec::Host host(trial % 2 + 1);
      const auto ra = blas::detail::operand_ref<float>(op_a, a.cview());
      const auto rb = blas::detail::operand_ref<float>(op_b, b.cview());
      blas::detail::host_gemm_2d(&host, {cs.m, cs.n, cs.k}, ra, rb,
                                 output(seeded, aux_seeded, nullptr), *kernel);
      blas::detail::host_gemm_2d(&host, {cs.m, cs.n, cs.k}, ra, rb,
                                 output(fresh, aux_fresh, r.data.data()), *kernel);
      for (std::int64_t i = 0; i < cs.m; ++i)
        CHECK(std::memcmp(&fresh.at(i, 0), &seeded.at(i, 0), cs.n * sizeof(float)) == 0);
      CHECK(padding_untouched(fresh));
      CHECK(std::memcmp(aux_fresh.data.data(), aux_seeded.data.data(),
                        aux_fresh.data.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(r.data.data(), r0.data.data(), r.data.size() * sizeof(float)) == 0);
    }
    // The public entry point, a bf16 C (the driver's row epilogue reads c_in), and c_in == C.
    exec::Host host(2);
    Matrix<bf16> rh(cs.m, cs.n), seeded_h(cs.m, cs.n), fresh_h(cs.m, cs.n);
    rh.fill_random(900 + trial);
    seeded_h = rh;
    blas::gemm(host, op_a, op_b, a.cview(), b.cview(), seeded_h.view(),
               {.alpha = alpha, .beta = beta});
    blas::gemm(host, op_a, op_b, a.cview(), b.cview(), fresh_h.view(),
               {.alpha = alpha, .beta = beta, .c_in = rh.data.data()});
    CHECK(std::memcmp(fresh_h.data.data(), seeded_h.data.data(),
                      fresh_h.data.size() * sizeof(bf16)) == 0);
    Matrix<float> same = r, seeded = r;
    blas::gemm(host, op_a, op_b, a.cview(), b.cview(), same.view(),
               {.alpha = alpha, .beta = beta, .c_in = same.data.data()});
    blas::gemm(host, op_a, op_b, a.cview(), b.cview(), seeded.view(),
               {.alpha = alpha, .beta = beta});
    CHECK(std::memcmp(same.data.data(), seeded.data.data(), same.data.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("host gemm: k == 0 scales C by beta, empty outputs are no-ops") {
  exec::Host host(2);
  Matrix<float> a(5, 0), b(0, 6), c(5, 6);
  c.fill(2.0);
  blas::gemm(host, Op::kN, Op::kN, a.cview(), b.cview(), c.view(), {.beta = 0.5f});
  for (std::int64_t i = 0; i < 5; ++i)
    for (std::int64_t j = 0; j < 6; ++j) CHECK(c.get(i, j) == 1.0);
  blas::gemm(host, Op::kN, Op::kN, a.cview(), b.cview(), c.view());
  for (std::int64_t i = 0; i < 5; ++i)
    for (std::int64_t j = 0; j < 6; ++j) CHECK(c.get(i, j) == 0.0);
  Matrix<float> a0(0, 4), b0(4, 3), c0(0, 3);
  blas::gemm(host, Op::kN, Op::kN, a0.cview(), b0.cview(), c0.view());  // nothing to do
}

TEST_CASE("host gemm: alpha == 0 reads neither A nor B (inf and NaN there do not reach C)") {
  const std::int64_t m = 13, n = 37, k = 21;
  for (const int threads : {1, 2}) {
    exec::Host host(threads);
    for (const Op op_a : {Op::kN, Op::kT}) {
      Matrix<float> a = op_a == Op::kN ? Matrix<float>(m, k) : Matrix<float>(k, m), b(k, n);
      a.fill_random(41);
      b.fill_random(42);
      a.at(0, 0) = std::numeric_limits<float>::infinity();
      b.at(1, 2) = std::numeric_limits<float>::quiet_NaN();
      for (const float beta : {0.0f, 1.0f, -0.5f}) {
        CAPTURE(threads);
        CAPTURE(beta);
        Matrix<float> c(m, n);
        c.fill(2.0);
        blas::gemm(host, op_a, Op::kN, a.cview(), b.cview(), c.view(),
                   {.alpha = 0.0f, .beta = beta});
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < n; ++j) REQUIRE(c.get(i, j) == 2.0 * beta);
      }
    }
  }
}

TEST_CASE("host gemm: epilogues match the float64 composition") {
  exec::Host host(2);
  const std::int64_t m = 70, n = 45, k = 133;
  Matrix<float> a(m, k, 1), b(n, k, 3);  // y = x @ W^T, W [out, in]
  a.fill_random(31);
  b.fill_random(32);
  std::vector<float> bias(n);
  std::vector<double> bias_d(n);
  for (std::int64_t j = 0; j < n; ++j) bias_d[j] = bias[j] = 0.01f * float(j) - 0.2f;

  for (Epilogue e : {Epilogue::kBias, Epilogue::kGelu, Epilogue::kBiasGelu}) {
    for (float beta : {0.0f, 0.5f}) {
      INFO("epilogue=", std::string(blas::to_string(e)), " beta=", beta);
      Matrix<float> c(m, n, 2), aux(m, n, 3);
      c.fill_random(33);
      const Reference ref = reference_gemm(Op::kN, Op::kT, a, b, c, 1.0, beta, e, bias_d);
      blas::gemm(host, Op::kN, Op::kT, a.cview(), b.cview(), c.view(),
                 {.beta = beta,
                  .epilogue = e,
                  .bias = bias.data(),
                  .aux = aux.data.data(),
                  .aux_ld = aux.ld});
      CHECK(rel_error(c, ref.out, m, n) < 1e-5);
      CHECK(padding_untouched(c));
      if (e != Epilogue::kBias) {
        CHECK(rel_error(aux, ref.aux, m, n) < 1e-5);
        CHECK(padding_untouched(aux));
      }
    }
  }

  SUBCASE("bf16 output with bias+gelu rounds once") {
    Matrix<bf16> c(m, n), aux(m, n);
    std::vector<bf16> bias16(n);
    std::vector<double> bias16_d(n);
    for (std::int64_t j = 0; j < n; ++j) {
      bias16[j] = bf16(bias[j]);
      bias16_d[j] = to_double(bias16[j]);
    }
    const Reference ref =
        reference_gemm(Op::kN, Op::kT, a, b, c, 1.0, 0.0, Epilogue::kBiasGelu, bias16_d);
    blas::gemm(host, Op::kN, Op::kT, a.cview(), b.cview(), c.view(),
               {.epilogue = Epilogue::kBiasGelu, .bias = bias16.data(), .aux = aux.data.data()});
    CHECK(rel_error(c, ref.out, m, n) < 1e-2);
    CHECK(rel_error(aux, ref.aux, m, n) < 1e-2);
  }

  SUBCASE("bias-grad: dW = dY^T @ X and db = column sums of dY") {
    // dY [batch, out] enters as op(A) = dY^T; X [batch, in].
    const std::int64_t batch = 300, out = 37, in = 29;
    for (Op op_a : kOps) {
      INFO("op_a=", std::string(blas::to_string(op_a)));
      Matrix<float> dy(stored_rows(op_a, out, batch), stored_cols(op_a, out, batch), 1);
      Matrix<float> x(batch, in, 2), dw(out, in, 1);
      dy.fill_random(41);
      x.fill_random(42);
      dw.fill_random(43);
      std::vector<float> db(out, std::numeric_limits<float>::quiet_NaN());
      const Reference ref = reference_gemm(op_a, Op::kN, dy, x, dw, 1.0, 1.0, Epilogue::kBiasGrad);
      blas::gemm(host, op_a, Op::kN, dy.cview(), x.cview(), dw.view(),
                 {.beta = 1.0f, .epilogue = Epilogue::kBiasGrad, .bias_grad = db.data()});
      CHECK(rel_error(dw, ref.out, out, in) < 1e-5);
      CHECK(rel_error_vec(db, ref.bias_grad) < 1e-5);
    }
  }

  SUBCASE("dgelu: dPre = (dH @ W) * gelu'(pre)") {
    Matrix<float> pre(m, n);
    pre.fill_random(51, -3.0, 3.0);
    Matrix<float> c(m, n);
    const Reference ref =
        reference_gemm(Op::kN, Op::kT, a, b, c, 1.0, 0.0, Epilogue::kDGelu, {}, &pre);
    blas::gemm(host, Op::kN, Op::kT, a.cview(), b.cview(), c.view(),
               {.epilogue = Epilogue::kDGelu, .aux = pre.data.data()});
    CHECK(rel_error(c, ref.out, m, n) < 1e-5);
  }
}

TEST_CASE("host gemm: same bits for 1, 2 and 3 threads") {
  const Case cs{300, 515, 700};
  Matrix<float> a(cs.m, cs.k), b(cs.k, cs.n), c0(cs.m, cs.n);
  a.fill_random(61);
  b.fill_random(62);
  c0.fill_random(63);
  Matrix<bf16> a16(cs.k, cs.m);
  a16.fill_random(64);
  std::vector<float> bias(cs.n, 0.125f);
  std::vector<std::vector<float>> results;
  std::vector<std::vector<bf16>> results16;
  for (int threads : {1, 2, 3}) {
    exec::Host host(threads);
    Matrix<float> c = c0;
    blas::gemm(host, Op::kN, Op::kN, a.cview(), b.cview(), c.view(),
               {.alpha = 0.3f, .beta = 0.7f, .epilogue = Epilogue::kBiasGelu, .bias = bias.data()});
    results.push_back(c.data);
    Matrix<bf16> c16(cs.m, cs.n);
    blas::gemm(host, Op::kT, Op::kN, a16.cview(), b.cview(), c16.view());
    results16.push_back(c16.data);
  }
  {  // The executor-less overload runs on exec::Host::default_instance(): same bits again.
    Matrix<float> c = c0;
    blas::gemm(Op::kN, Op::kN, a.cview(), b.cview(), c.view(),
               {.alpha = 0.3f, .beta = 0.7f, .epilogue = Epilogue::kBiasGelu, .bias = bias.data()});
    results.push_back(c.data);
    Matrix<bf16> c16(cs.m, cs.n);
    blas::gemm(Op::kT, Op::kN, a16.cview(), b.cview(), c16.view());
    results16.push_back(c16.data);
  }
  for (std::size_t t = 1; t < results.size(); ++t) {
    CHECK(std::memcmp(results[t].data(), results[0].data(), results[0].size() * sizeof(float)) ==
          0);
    CHECK(std::memcmp(results16[t].data(), results16[0].data(),
                      results16[0].size() * sizeof(bf16)) == 0);
  }
  // Weight-gradient shapes (dW += dY^T X, k = batch * time), whose few row blocks are split
  // into a multiple of the thread count: the bits stay those of one thread.
  for (const Case& dw : {Case{512, 128, 1024}, Case{128, 128, 1000}, Case{60, 40, 300}}) {
    Matrix<float> dy(dw.k, dw.m), x(dw.k, dw.n), w0(dw.m, dw.n);
    dy.fill_random(65);
    x.fill_random(66);
    w0.fill_random(67);
    std::vector<float> first;
    for (int threads : {1, 2, 3, 4}) {
      exec::Host host(threads);
      Matrix<float> w = w0;
      blas::gemm(host, Op::kT, Op::kN, dy.cview(), x.cview(), w.view(), {.beta = 1.0f});
      if (threads == 1) first = w.data;
      CAPTURE(dw.m);
      CAPTURE(threads);
      CHECK(std::memcmp(w.data.data(), first.data(), first.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("host gemm bias-grad: the column sums of dY in k order, bit for bit, any threads") {
  // The f32 dY^T case sums while it packs (only the first column segment of a row block, only the
  // first column chunk), and must give the separate pass's sums: plain ascending float sums, for
  // shapes that split columns into segments and chunks. A row-major op(A) (the separate pass's
  // 8-lane sums) gives the same bits for any thread count.
  std::uint64_t seed = 71;
  for (const Case& sh : {Case{37, 29, 300}, Case{20, 600, 8192}, Case{512, 128, 1024},
                         Case{13, 1, 5}, Case{1, 40, 77}, Case{200, 64, 1}}) {
    for (Op op_a : kOps) {
      Matrix<float> dy(stored_rows(op_a, sh.m, sh.k), stored_cols(op_a, sh.m, sh.k), 3);
      Matrix<float> x(sh.k, sh.n), dw0(sh.m, sh.n);
      dy.fill_random(seed++);
      x.fill_random(seed++);
      dw0.fill_random(seed++);
      // op(A) = dY^T: the ascending sums; a row-major op(A): one thread's result.
      std::vector<float> want(static_cast<std::size_t>(sh.m), 0.0f);
      if (op_a == Op::kT)
        for (std::int64_t p = 0; p < sh.k; ++p)
          for (std::int64_t i = 0; i < sh.m; ++i) want[static_cast<std::size_t>(i)] += dy.at(p, i);
      for (int threads : {1, 2, 3}) {
        exec::Host host(threads);
        Matrix<float> dw = dw0;
        std::vector<float> db(static_cast<std::size_t>(sh.m),
                              std::numeric_limits<float>::quiet_NaN());
        blas::gemm(host, op_a, Op::kN, dy.cview(), x.cview(), dw.view(),
                   {.beta = 1.0f, .epilogue = Epilogue::kBiasGrad, .bias_grad = db.data()});
        CAPTURE(sh.m);
        CAPTURE(sh.n);
        CAPTURE(sh.k);
        CAPTURE(threads);
        INFO("op_a=", std::string(blas::to_string(op_a)));
        if (op_a == Op::kN && threads == 1) want = db;
        CHECK(std::memcmp(db.data(), want.data(), want.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("host gemm batched: strided items and a broadcast operand match rank-2 calls") {
  exec::Host host(2);
  const std::int64_t batch = 5, m = 33, n = 40, k = 21;
  // A: [batch, m, k] inside a larger buffer (batch stride > m * k, padded rows).
  const std::int64_t lda = k + 3, sa = m * lda + 7;
  std::vector<float> abuf(static_cast<std::size_t>(batch * sa));
  Matrix<float> fill(1, static_cast<std::int64_t>(abuf.size()));
  fill.fill_random(71);
  abuf = fill.data;
  Matrix<float> w(n, k);  // shared by every item: batch 1, used as op(B) = W^T
  w.fill_random(72);
  std::vector<float> cbuf(static_cast<std::size_t>(batch * m * n), 1.0f);
  const HostView<const float, 3> a3(abuf.data(), {{batch, m, k}}, {{sa, lda, 1}});
  const HostView<const float, 3> w3(w.data.data(), {{1, n, k}}, {{0, k, 1}});
  const HostView<float, 3> c3(cbuf.data(), {{batch, m, n}}, {{m * n, n, 1}});
  blas::gemm(host, Op::kN, Op::kT, a3, w3, c3, {.alpha = 2.0f, .beta = -1.0f});
  for (std::int64_t i = 0; i < batch; ++i) {
    Matrix<float> ai(m, k), ci(m, n);
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t p = 0; p < k; ++p) ai.at(r, p) = abuf[i * sa + r * lda + p];
    ci.fill(1.0);
    const Reference ref = reference_gemm(Op::kN, Op::kT, ai, w, ci, 2.0, -1.0, Epilogue::kNone);
    Matrix<float> got(m, n);
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t j = 0; j < n; ++j) got.at(r, j) = cbuf[i * m * n + r * n + j];
    CHECK(rel_error(got, ref.out, m, n) < 1e-5);
    // The batched path runs the same kernel as the rank-2 one: identical bits.
    blas::gemm(host, Op::kN, Op::kT, ai.cview(), w.cview(), ci.view(),
               {.alpha = 2.0f, .beta = -1.0f});
    CHECK(std::memcmp(ci.data.data(), got.data.data(), got.data.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("host gemm batched: items of C side by side in one row stride are accepted") {
  // Heads side by side in [m, batch * n] (item stride n, row stride batch * n) share no element:
  // they used to be refused as overlapping. Items that do share elements still throw.
  exec::Host host(2);
  const std::int64_t batch = 3, m = 9, n = 20, k = 13;
  Matrix<float> a(batch * m, k), b(k, n);
  a.fill_random(81);
  b.fill_random(82);
  Matrix<float> c(m, batch * n, 2);
  c.fill(0.5);
  const HostView<float, 3> c3(c.data.data(), {{batch, m, n}}, {{n, c.ld, 1}});
  blas::gemm(host, Op::kN, Op::kN, HostView<const float, 3>(a.data.data(), {{batch, m, k}}),
             HostView<const float, 3>(b.data.data(), {{1, k, n}}), c3, {.beta = 2.0f});
  CHECK(padding_untouched(c));
  for (std::int64_t i = 0; i < batch; ++i) {
    Matrix<float> ci(m, n);
    ci.fill(0.5);
    blas::gemm(host, Op::kN, Op::kN, a.cview().slice(0, i * m, (i + 1) * m), b.cview(), ci.view(),
               {.beta = 2.0f});
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t j = 0; j < n; ++j) CHECK(c.at(r, i * n + j) == ci.at(r, j));
  }
  // Item stride n - 1: the last column of item i is the first of item i + 1.
  std::string msg;
  try {
    blas::gemm(host, Op::kN, Op::kN, HostView<const float, 3>(a.data.data(), {{batch, m, k}}),
               HostView<const float, 3>(b.data.data(), {{1, k, n}}),
               HostView<float, 3>(c.data.data(), {{batch, m, n}}, {{n - 1, c.ld, 1}}));
  } catch (const trainkit::Error& e) {
    msg = e.what();
  }
  CHECK(msg.find("makes items 0 and 1 of 9 x 20 (row stride 62) overlap") != std::string::npos);
}

TEST_CASE("host gemm batched: C sharing memory with an item of A or B throws") {
  exec::Host host(1);
  const std::int64_t batch = 4, m = 6, n = 6, k = 6;
  Matrix<float> buf(batch * m + 3, k), w(k, n);
  buf.fill_random(91);
  w.fill_random(92);
  const auto items = [&](std::int64_t first_row) {
    return HostView<float, 3>(buf.data.data() + first_row * k, {{batch, m, k}}, {{m * k, k, 1}});
  };
  const auto error_of = [&](const HostView<const float, 3>& a, const HostView<const float, 3>& b,
                            const HostView<float, 3>& c) {
    try {
      blas::gemm(host, Op::kN, Op::kN, a, b, c);
    } catch (const trainkit::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const HostView<const float, 3> w3(w.data.data(), {{1, k, n}}, {{0, n, 1}});
  // C == A; C shifted by one item and three rows (item i of C meets items i + 1 and i + 2 of A);
  // B inside C.
  std::string msg = error_of(items(0), w3, items(0));
  CHECK(msg.find("item 0 of C [6, 6]") != std::string::npos);
  CHECK(msg.find("overlaps item 0 of A [6, 6]") != std::string::npos);
  msg = error_of(items(0).slice(0, 0, batch - 1), w3, items(m + 3).slice(0, 0, batch - 1));
  CHECK(msg.find("item 0 of C") != std::string::npos);
  CHECK(msg.find("overlaps item 1 of A") != std::string::npos);
  Matrix<float> out(batch * m, n);
  const HostView<float, 3> out3(out.data.data(), {{batch, m, n}}, {{m * n, n, 1}});
  msg = error_of(items(0), HostView<const float, 3>(out3.slice(0, 2, 3)), out3);
  CHECK(msg.find("item 2 of C") != std::string::npos);
  CHECK(msg.find("overlaps item 0 of B") != std::string::npos);
  msg = error_of(items(0).slice(0, 0, 1), items(0).slice(0, 1, 2), items(0).slice(0, 2, 3));
  CHECK(msg.empty());  // three disjoint items of one buffer
  // A one-row C inside an item of B.
  msg = error_of(HostView<const float, 3>(buf.data.data(), {{1, 1, k}}, {{0, k, 1}}),
                 items(0).slice(0, 1, 2),
                 HostView<float, 3>(buf.data.data() + m * k + 5, {{1, 1, n}}, {{0, n, 1}}));
  CHECK(msg.find("overlaps item 0 of B") != std::string::npos);
  // Interleaved but disjoint: A = columns [0, 3) of every row, C = columns [3, 6), k = n = 3.
  Matrix<float> x(batch * m, 6), x0(0, 0);
  x.fill_random(93);
  x0 = x;
  Matrix<float> w2(3, 3);
  w2.fill_random(94);
  blas::gemm(host, Op::kN, Op::kN,
             HostView<const float, 3>(x.data.data(), {{batch, m, 3}}, {{m * 6, 6, 1}}),
             HostView<const float, 3>(w2.data.data(), {{1, 3, 3}}, {{0, 3, 1}}),
             HostView<float, 3>(x.data.data() + 3, {{batch, m, 3}}, {{m * 6, 6, 1}}));
  for (std::int64_t r = 0; r < batch * m; ++r)
    for (std::int64_t j = 0; j < 3; ++j) {
      float want = 0.0f;
      for (std::int64_t p = 0; p < 3; ++p) want = std::fma(x0.at(r, p), w2.at(p, j), want);
      CHECK(x.at(r, j) == x0.at(r, j));
      CHECK(x.at(r, 3 + j) == doctest::Approx(want).epsilon(1e-6));
    }
}

TEST_CASE("host gemm: training shapes (MLP and GPT block) vs float64") {
  exec::Host host(2);
  // One row sample of the reference keeps this fast: every element of a few rows.
  struct Shape {
    Op op_a, op_b;
    std::int64_t m, n, k;
  };
  const Shape shapes[] = {{Op::kN, Op::kT, 256, 1024, 784},   // MLP fc1 forward
                          {Op::kT, Op::kN, 1024, 784, 256},   // fc1 weight gradient
                          {Op::kN, Op::kN, 256, 784, 1024},   // fc1 input gradient
                          {Op::kN, Op::kT, 1024, 768, 256}};  // GPT qkv projection
  std::uint64_t seed = 81;
  for (const Shape& s : shapes) {
    Matrix<float> a(stored_rows(s.op_a, s.m, s.k), stored_cols(s.op_a, s.m, s.k));
    Matrix<float> b(stored_rows(s.op_b, s.k, s.n), stored_cols(s.op_b, s.k, s.n));
    Matrix<float> c(s.m, s.n);
    a.fill_random(seed++);
    b.fill_random(seed++);
    blas::gemm(host, s.op_a, s.op_b, a.cview(), b.cview(), c.view());
    double num = 0, den = 0;
    for (std::int64_t i : {std::int64_t{0}, s.m / 2, s.m - 1})
      for (std::int64_t j = 0; j < s.n; ++j) {
        double ref = 0;
        for (std::int64_t p = 0; p < s.k; ++p)
          ref += op_get(a, s.op_a, i, p) * op_get(b, s.op_b, p, j);
        num += (c.get(i, j) - ref) * (c.get(i, j) - ref);
        den += ref * ref;
      }
    INFO("m=", s.m, " n=", s.n, " k=", s.k);
    CHECK(std::sqrt(num / den) < 1e-5);
  }
}

TEST_CASE("host gemm: CBLAS backend") {
  exec::Host host(2);
  if constexpr (blas::detail::kHaveCblas) {
    const Case cases[] = {{1, 1, 1}, {7, 129, 1000}, {129, 7, 7}, {200, 150, 170}};
    std::uint64_t seed = 91;
    for (const Case& cs : cases)
      for (Op op_a : kOps)
        for (Op op_b : kOps) {
          INFO("m=", cs.m, " n=", cs.n, " k=", cs.k);
          CHECK(run_case<float, float, float>(host, op_a, op_b, cs, 1.5f, 0.5f, seed++,
                                              HostBackend::kCblas) < 1e-5);
        }
    // Built-in and CBLAS agree with each other (and the epilogue runs after sgemm).
    Matrix<float> a(64, 96), b(80, 96);
    a.fill_random(95);
    b.fill_random(96);
    std::vector<float> bias(80, -0.25f);
    Matrix<float> c1(64, 80), c2(64, 80);
    blas::gemm(host, Op::kN, Op::kT, a.cview(), b.cview(), c1.view(),
               {.epilogue = Epilogue::kBiasGelu,
                .bias = bias.data(),
                .host_backend = HostBackend::kBuiltin});
    blas::gemm(host, Op::kN, Op::kT, a.cview(), b.cview(), c2.view(),
               {.epilogue = Epilogue::kBiasGelu,
                .bias = bias.data(),
                .host_backend = HostBackend::kCblas});
    std::vector<double> c1d(c1.data.begin(), c1.data.end());
    CHECK(rel_error(c2, c1d, 64, 80) < 1e-5);
    // options.c_in: copied into C before sgemm, then the same result as the built-in kernel.
    Matrix<float> r(64, 80), c3(64, 80), c4(64, 80);
    r.fill_random(97);
    blas::gemm(host, Op::kN, Op::kT, a.cview(), b.cview(), c3.view(),
               {.beta = 0.5f, .c_in = r.data.data(), .host_backend = HostBackend::kBuiltin});
    blas::gemm(host, Op::kN, Op::kT, a.cview(), b.cview(), c4.view(),
               {.beta = 0.5f, .c_in = r.data.data(), .host_backend = HostBackend::kCblas});
    std::vector<double> c3d(c3.data.begin(), c3.data.end());
    CHECK(rel_error(c4, c3d, 64, 80) < 1e-5);
  } else {
    Matrix<float> a(2, 2), b(2, 2), c(2, 2);
    CHECK_THROWS_AS(blas::gemm(host, Op::kN, Op::kN, a.cview(), b.cview(), c.view(),
                               {.host_backend = HostBackend::kCblas}),
                    trainkit::Error);
  }
}

TEST_CASE("host gemm: an output sharing memory with another operand throws; interleaved is fine") {
  // The kernels read A and B while they write C (and aux, bias_grad): C == A used to return
  // wrong values without an error. Views that only interleave in one buffer (column slices of
  // one row-major matrix, as a fused QKV buffer holds) share no element and must still work.
  exec::Host host(2);
  const std::int64_t n = 40;
  const auto throws_naming = [&](auto&& call, const std::string& first, const std::string& second) {
    std::string msg;
    try {
      call();
    } catch (const trainkit::Error& e) {
      msg = e.what();
    }
    INFO(msg);
    CHECK(msg.find(first + " [") != std::string::npos);
    CHECK(msg.find("overlaps " + second + " [") != std::string::npos);
  };
  Matrix<float> a(n, n), b(n, n);
  a.fill_random(1);
  b.fill_random(2);
  throws_naming([&] { blas::gemm(host, Op::kN, Op::kN, a.cview(), b.cview(), a.view()); }, "C",
                "A");
  throws_naming([&] { blas::gemm(host, Op::kT, Op::kN, a.cview(), b.cview(), b.view()); }, "C",
                "B");
  // C's last row starts inside A's last row (partial overlap) and a 1-row C in a row of B.
  Matrix<float> big(2 * n, n);
  big.fill_random(3);
  const HostView<float, 2> lower(big.data.data() + n * n - 5, {{n, n}}, {{n, 1}});
  throws_naming(
      [&] { blas::gemm(host, Op::kN, Op::kN, big.cview().slice(0, 0, n), b.cview(), lower); }, "C",
      "A");
  const HostView<float, 2> row(b.data.data() + 7 * n + 3, {{1, 30}}, {{1000, 1}});
  throws_naming(
      [&] {
        blas::gemm(host, Op::kN, Op::kN, a.cview().slice(0, 0, 1), b.cview().slice(1, 0, 30), row);
      },
      "C", "B");
  Matrix<float> c(n, n);
  std::vector<float> aux(static_cast<std::size_t>(n * n));
  throws_naming(
      [&] {
        blas::gemm(host, Op::kN, Op::kN, a.cview(), b.cview(), c.view(),
                   {.epilogue = Epilogue::kGelu, .aux = c.data.data()});
      },
      "C", "options.aux");
  throws_naming(
      [&] {
        blas::gemm(host, Op::kN, Op::kN, a.cview(), b.cview(), c.view(),
                   {.epilogue = Epilogue::kBias, .bias = c.data.data() + 3 * n});
      },
      "C", "options.bias");
  throws_naming(
      [&] {
        blas::gemm(host, Op::kN, Op::kN, a.cview(), b.cview(), c.view(),
                   {.epilogue = Epilogue::kBiasGelu, .bias = aux.data(), .aux = aux.data() + 1});
      },
      "options.aux", "options.bias");
  throws_naming(
      [&] {
        blas::gemm(host, Op::kT, Op::kN, a.cview(), b.cview(), c.view(),
                   {.epilogue = Epilogue::kBiasGrad, .bias_grad = a.data.data() + 5});
      },
      "options.bias_grad", "A");
  throws_naming(
      [&] {
        blas::gemm(host, Op::kN, Op::kN, a.cview(), b.cview(), c.view(),
                   {.beta = 1.0f, .c_in = c.data.data() + 1});
      },
      "C", "options.c_in");

  // Allowed: c_in == C, and column slices of one buffer: C = buf[:, 0:n), A = buf[:, n:2n),
  // B = buf[:, 2n:3n) (k == n), each row of C between rows of A and B.
  Matrix<float> buf(n, 3 * n);
  buf.fill_random(4);
  const Matrix<float> buf0 = buf;
  const auto slice = [&](Matrix<float>& x, std::int64_t c0) {
    return HostView<float, 2>(x.data.data() + c0, {{n, n}}, {{3 * n, 1}});
  };
  Matrix<float> a2(n, n), b2(n, n), c2(n, n);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      a2.at(i, j) = buf0.at(i, n + j);
      b2.at(i, j) = buf0.at(i, 2 * n + j);
      c2.at(i, j) = buf0.at(i, j);
    }
  blas::gemm(host, Op::kN, Op::kT, HostView<const float, 2>(slice(buf, n)),
             HostView<const float, 2>(slice(buf, 2 * n)), slice(buf, 0),
             {.alpha = 0.5f, .beta = 2.0f, .c_in = buf.data.data()});
  blas::gemm(host, Op::kN, Op::kT, a2.cview(), b2.cview(), c2.view(),
             {.alpha = 0.5f, .beta = 2.0f});
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < 3 * n; ++j) {
      const float want = j < n ? c2.at(i, j) : buf0.at(i, j);
      REQUIRE(std::memcmp(&buf.at(i, j), &want, sizeof(float)) == 0);
    }
}

TEST_CASE("gemm overlap check: byte_rows_overlap agrees with a byte-by-byte test") {
  std::mt19937_64 rng(99);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 3000; ++trial) {
    blas::detail::ByteRows v[2];
    std::vector<int> owner(600, -1);
    bool shared = false;
    for (int s = 0; s < 2; ++s) {
      v[s].rows = pick(0, 6);
      v[s].width = pick(0, 12);
      v[s].ld = v[s].width + pick(0, 20);
      if (v[s].rows == 1) v[s].ld = pick(0, 50);  // a single row: any stride
      v[s].base = static_cast<std::uintptr_t>(pick(0, 200));
      for (std::int64_t r = 0; r < v[s].rows; ++r)
        for (std::int64_t j = 0; j < v[s].width; ++j) {
          const auto at = static_cast<std::size_t>(v[s].base + r * v[s].ld + j);
          if (owner[at] == 0 && s == 1) shared = true;
          owner[at] = s;
        }
    }
    INFO("trial ", trial);
    CHECK(blas::detail::byte_rows_overlap(v[0], v[1]) == shared);
    CHECK(blas::detail::byte_rows_overlap(v[1], v[0]) == shared);
  }
}

TEST_CASE("gemm overlap check: batched items of C against items of A, element by element") {
  // Random batched views in one buffer (negative and zero batch strides, single rows with any
  // stride, broadcast): the check throws exactly when some element of C is an element of A.
  std::mt19937_64 rng(98);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  std::vector<float> buf(700);
  for (int trial = 0; trial < 3000; ++trial) {
    const std::int64_t bc = pick(1, 4), bx = pick(0, 1) == 0 ? 1 : bc;
    const std::int64_t rc = pick(1, 4), wc = pick(1, 5);
    const std::int64_t ldc = rc == 1 ? pick(0, 9) : wc + pick(0, 6);
    const std::int64_t rx = pick(1, 4), wx = pick(1, 5);
    const std::int64_t ldx = rx == 1 ? pick(0, 9) : wx + pick(0, 6);
    const std::int64_t sc = pick(-40, 40), sx = pick(-40, 40);
    const std::int64_t oc = pick(200, 400), ox = pick(200, 400);
    const HostView<float, 3> c(buf.data() + oc, {{bc, rc, wc}}, {{sc, ldc, 1}});
    const HostView<const float, 3> x(buf.data() + ox, {{bx, rx, wx}}, {{sx, ldx, 1}});
    std::vector<char> in_c(buf.size(), 0);
    for (std::int64_t i = 0; i < bc; ++i)
      for (std::int64_t r = 0; r < rc; ++r)
        for (std::int64_t j = 0; j < wc; ++j)
          in_c[static_cast<std::size_t>(oc + i * sc + (rc == 1 ? 0 : r * ldc) + j)] = 1;
    bool shared = false;
    for (std::int64_t i = 0; i < bx; ++i)
      for (std::int64_t r = 0; r < rx; ++r)
        for (std::int64_t j = 0; j < wx; ++j)
          shared = shared || in_c[static_cast<std::size_t>(ox + (bx == 1 ? 0 : i * sx) +
                                                           (rx == 1 ? 0 : r * ldx) + j)] != 0;
    bool threw = false;
    try {
      blas::detail::check_batched_input_overlap("test", c, x, "A");
    } catch (const trainkit::Error&) {
      threw = true;
    }
    INFO("trial ", trial);
    CHECK(threw == shared);
  }
}

TEST_CASE("host gemm: bad views and options throw trainkit::Error naming the shapes") {
  exec::Host host(1);
  Matrix<float> a(4, 5), b(6, 3), c(4, 3);
  const auto what = [&](auto&& call) -> std::string {
    try {
      call();
    } catch (const trainkit::Error& e) {
      return e.what();
    }
    return "";
  };
  const std::string inner =
      what([&] { blas::gemm(host, Op::kN, Op::kN, a.cview(), b.cview(), c.view()); });
  CHECK(inner.find("inner dimensions") != std::string::npos);
  CHECK(inner.find("[4, 5]") != std::string::npos);

  Matrix<float> b2(5, 3), c2(3, 4);
  const std::string out =
      what([&] { blas::gemm(host, Op::kN, Op::kN, a.cview(), b2.cview(), c2.view()); });
  CHECK(out.find("C is [3, 4]") != std::string::npos);

  // A transposed *view* (column stride != 1) is refused: pass Op::kT instead.
  Matrix<float> at(5, 4);
  const HostView<const float, 2> transposed = at.cview().transposed();
  const std::string stride =
      what([&] { blas::gemm(host, Op::kN, Op::kN, transposed, b2.cview(), c.view()); });
  CHECK(stride.find("unit column stride") != std::string::npos);

  const std::string bias = what([&] {
    blas::gemm(host, Op::kN, Op::kN, a.cview(), b2.cview(), c.view(),
               {.epilogue = Epilogue::kBias});
  });
  CHECK(bias.find("options.bias") != std::string::npos);
  Matrix<float> a3(2, 4), b3(4, 3), c3(3, 3);  // batch of 2 whose C items would overlap
  const std::string overlap = what([&] {
    blas::gemm(host, Op::kN, Op::kN,
               trainkit::HostView<const float, 3>(a3.data.data(), {{2, 1, 4}}),
               trainkit::HostView<const float, 3>(b3.data.data(), {{1, 4, 3}}),
               trainkit::HostView<float, 3>(c3.data.data(), {{2, 1, 3}}, {{2, 3, 1}}));
  });
  CHECK(overlap.find("overlap") != std::string::npos);
  const std::string dgelu = what([&] {
    blas::gemm(host, Op::kN, Op::kN, a.cview(), b2.cview(), c.view(),
               {.epilogue = Epilogue::kDGelu});
  });
  CHECK(dgelu.find("options.aux") != std::string::npos);
  const std::string batched_c_in = what([&] {
    blas::gemm(host, Op::kN, Op::kN,
               trainkit::HostView<const float, 3>(a3.data.data(), {{2, 1, 4}}),
               trainkit::HostView<const float, 3>(b3.data.data(), {{1, 4, 3}}),
               trainkit::HostView<float, 3>(c3.data.data(), {{2, 1, 3}}),
               {.beta = 1.0f, .c_in = c3.data.data()});
  });
  CHECK(batched_c_in.find("options.c_in is only supported for rank-2") != std::string::npos);
}

TEST_CASE("gelu_tanh and its derivative: scalar and vectorised forms vs float64") {
  // Dense over the interesting range plus extremes (no NaN/Inf anywhere, exact limits).
  std::vector<float> xs;
  for (int i = -4000; i <= 4000; ++i) xs.push_back(0.0025f * float(i));
  for (float x :
       {-1e30f, -1e4f, -88.0f, -20.0f, -9.5f, 9.5f, 20.0f, 88.0f, 1e4f, 1e30f, 1e-30f, -0.0f})
    xs.push_back(x);
  const auto n = static_cast<std::int64_t>(xs.size());
  std::vector<float> span = xs, grad_span(xs.size(), 1.0f);
  blas::detail::gemm_gelu_span(span.data(), nullptr, n);
  blas::detail::gemm_gelu_span(grad_span.data(), xs.data(), n);
  double worst = 0, worst_grad = 0;
  int non_finite = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double x = xs[i];
    const double ref = gelu_ref(x), dref = gelu_grad_ref(x);
    // Error relative to max(|ref|, floor): where GELU (or its derivative, a difference of two
    // terms of size ~0.2 near x = -0.75) crosses 0, relative error means nothing.
    const double scale = std::max(std::abs(ref), 1e-3), dscale = std::max(std::abs(dref), 0.05);
    for (double got : {double(blas::gelu_tanh(float(x))), double(span[i])}) {
      non_finite += std::isfinite(got) ? 0 : 1;
      if (std::isfinite(got)) worst = std::max(worst, std::abs(got - ref) / scale);
    }
    for (double got : {double(blas::gelu_tanh_grad(float(x))), double(grad_span[i])}) {
      non_finite += std::isfinite(got) ? 0 : 1;
      if (std::isfinite(got)) worst_grad = std::max(worst_grad, std::abs(got - dref) / dscale);
    }
  }
  // gelu_tanh_slope (scalar) and gemm_gelu_slope_span (vectorised): both values at once.
  std::vector<float> both = xs, slope_span(xs.size());
  blas::detail::gemm_gelu_slope_span(both.data(), slope_span.data(), n);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double x = xs[i];
    const double scale = std::max(std::abs(gelu_ref(x)), 1e-3);
    const double dscale = std::max(std::abs(gelu_grad_ref(x)), 0.05);
    float scalar_slope = 0.0f;
    const float scalar = blas::gelu_tanh_slope(xs[i], &scalar_slope);
    for (double got : {double(scalar), double(both[i])}) {
      non_finite += std::isfinite(got) ? 0 : 1;
      if (std::isfinite(got)) worst = std::max(worst, std::abs(got - gelu_ref(x)) / scale);
    }
    for (double got : {double(scalar_slope), double(slope_span[i])}) {
      non_finite += std::isfinite(got) ? 0 : 1;
      if (std::isfinite(got))
        worst_grad = std::max(worst_grad, std::abs(got - gelu_grad_ref(x)) / dscale);
    }
  }
  CHECK(non_finite == 0);
  CHECK(worst < 2e-6);
  CHECK(worst_grad < 2e-6);
  float big_slope = 0.0f;
  CHECK(blas::gelu_tanh_slope(1e30f, &big_slope) == 1e30f);
  CHECK(big_slope == 1.0f);
  CHECK(blas::gelu_tanh(1e30f) == 1e30f);
  CHECK(std::abs(blas::gelu_tanh(-1e30f)) < 1e-30f);
  // NaN must survive the activation (a loss scaler looks for it downstream).
  std::vector<float> nan(9, std::numeric_limits<float>::quiet_NaN()), ones(9, 1.0f);
  blas::detail::gemm_gelu_span(nan.data(), nullptr, 9);
  blas::detail::gemm_gelu_span(
      ones.data(), std::vector<float>(9, std::numeric_limits<float>::quiet_NaN()).data(), 9);
  std::vector<float> nan_slope(9);
  std::vector<float> nan2(9, std::numeric_limits<float>::quiet_NaN());
  blas::detail::gemm_gelu_slope_span(nan2.data(), nan_slope.data(), 9);
  for (int i = 0; i < 9; ++i) {
    CHECK(std::isnan(nan[i]));
    CHECK(std::isnan(ones[i]));
    CHECK(std::isnan(nan2[i]));
    CHECK(std::isnan(nan_slope[i]));
  }
  CHECK(std::isnan(blas::gelu_tanh(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isnan(blas::gelu_tanh_grad(std::numeric_limits<float>::quiet_NaN())));
}
