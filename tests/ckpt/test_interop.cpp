// Python interop of checkpoints: tests/fixtures/ckpt/check_checkpoint.py reads a checkpoint this
// test writes with safetensors.numpy (names, shapes, exact values), recomputes every checksum
// in pure Python, and - where torch is importable - loads the model file into the equivalent
// torch.nn.Sequential with load_state_dict(strict=True) and reproduces trainkit's output.
// Python is $TRAINKIT_PYTHON (default python3); without numpy/safetensors the script exits 77
// and the test is skipped, unless TRAINKIT_REQUIRE_PYTHON_INTEROP=1 (CI), where that fails.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <trainkit/ckpt/checkpointer.hpp>
#include <trainkit/core/tensor.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/io/json.hpp>
#include <trainkit/nn/activation.hpp>
#include <trainkit/nn/linear.hpp>
#include <trainkit/nn/param_arena.hpp>
#include <trainkit/nn/sequential.hpp>
#include <trainkit/optim/adamw.hpp>

#include "ckpt/ckpt_test_util.hpp"

namespace {
namespace tk = trainkit;
namespace ckpt = trainkit::ckpt;
namespace io = trainkit::io;
namespace nn = trainkit::nn;

io::Json exact(float v) { return io::Json::number(tk::StateDict::number_to_string(double(v))); }

}  // namespace

TEST_CASE("interop: Python reads a trainkit checkpoint (safetensors.numpy, torch when present)") {
  ckpt_test::TempDir dir;
  tk::exec::Host exec(1);
  nn::ParamArena<> arena;
  nn::Sequential net{nn::Linear(arena, "0", {.in_features = 3, .out_features = 4}), nn::ReLU{},
                     nn::Linear(arena, "2", {.in_features = 4, .out_features = 2})};
  arena.finalize();
  arena.initialize(3);
  tk::optim::AdamW<> opt(arena, {.lr = 0.01});
  for (std::int64_t i = 0; i < arena.buffer_numel(); ++i)
    arena.grads_data()[i] = float(i % 7) * 0.125f - 0.375f;
  opt.step(exec);
  ckpt::TrainState state;
  state.model(arena).add("optimizer", opt);
  state.step = 5;
  ckpt::Checkpointer ck(dir / "ckpt", {.durable = false});
  const auto path = ck.save(state);

  const std::vector<float> x = {0.5f, -1.25f, 2.0f, -0.75f, 0.25f, 1.5f};
  tk::Tensor<float> in(tk::Shape{2, 3}), out(tk::Shape{2, 2});
  for (std::size_t i = 0; i < x.size(); ++i) in.data()[i] = x[i];
  decltype(net)::Context ctx;
  net.forward(exec, ctx, in.view<2>(), out.view<2>());

  io::Json expected = io::Json::object();
  expected.set("step", 5);
  io::Json params = io::Json::object();
  for (const nn::ParamInfo& p : arena.infos()) {
    io::Json e = io::Json::object();
    io::Json shape = io::Json::array();
    for (int d = 0; d < p.shape.rank(); ++d) shape.push_back(p.shape[d]);
    e.set("shape", std::move(shape));
    io::Json values = io::Json::array();
    for (std::int64_t i = 0; i < p.numel; ++i)
      values.push_back(exact(arena.params_data()[p.offset + i]));
    e.set("values", std::move(values));
    params.set(p.name, std::move(e));
  }
  expected.set("params", std::move(params));
  io::Json input = io::Json::array(), output = io::Json::array();
  for (float v : x) input.push_back(exact(v));
  for (std::int64_t i = 0; i < out.numel(); ++i) output.push_back(exact(out.data()[i]));
  expected.set("input", std::move(input));
  expected.set("output", std::move(output));
  ckpt_test::write_file(dir / "expected.json", expected.dump());

  const std::string cmd = "'" + ckpt_test::python() + "' '" + TRAINKIT_SOURCE_DIR +
                          "/tests/fixtures/ckpt/check_checkpoint.py' '" + path.string() + "' '" +
                          (dir / "expected.json").string() + "'";
  const int status = std::system(cmd.c_str());
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (rc == 77) {
    const char* req = std::getenv("TRAINKIT_REQUIRE_PYTHON_INTEROP");
    if (req != nullptr && std::string(req) == "1")
      FAIL("TRAINKIT_REQUIRE_PYTHON_INTEROP=1 but ", ckpt_test::python(),
           " cannot import numpy and safetensors");
    WARN_MESSAGE(false, "skipped: ", ckpt_test::python(),
                 " has no numpy/safetensors (set TRAINKIT_PYTHON to one that has)");
    return;
  }
  CHECK_MESSAGE(rc == 0, "check_checkpoint.py failed (see its output above)");
}
