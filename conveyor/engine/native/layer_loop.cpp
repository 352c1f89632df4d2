// The Llama forward's layer loop in C++ (CPU, float32): the same calls as Llama.forward's Python loop
// (engine/model/llama.py), in the same order, on the same buffers, so the same bits.
//
// Why: between a layer's kernels the Python loop spent 5-7 ms of a ~100 ms 32-row decode step in
// the interpreter and in dispatch, several times those ops' idle cost, since each GEMM evicts the
// interpreter's caches (bench/README.md, sitting P). Here each layer is ten calls: the fused ops of
// this extension directly, oneDNN's prepacked linear (mkldnn::_linear_pointwise, what Linear calls)
// and the attention kernels of engine/attention's extension (conveyor::write_kv, paged_decode_into,
// paged_prefill) through torch's dispatcher. The GIL is released for the whole loop, so the
// worker's other threads run meanwhile.
//
// One step's attention: the decode rows (one query each) first, through the paged decode kernel;
// then the prefill chunks, all in one call of the paged prefill kernel. Padding rows (the batch
// padded to the GEMMs' exact minimum, see linear.py) are attended by nobody and read as zeros by
// the o projection, as F.pad gives them in the Python loop.
//
// Each kind of call's wall time in the last forward is kept (a clock read around each call, ~20 ns
// against calls of µs to ms), for the step observer (conveyor/engine/step_observer.py): last_timings().

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fused_ops.h"

namespace {

using Linear = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, std::string_view,
                          c10::List<std::optional<at::Scalar>>, std::optional<std::string_view>);
using LinearAdd = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                             std::string_view);
using WriteKv = void(at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor);
using Decode = void(at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, double, int64_t, at::Tensor);
using Prefill = void(at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, double, int64_t,
                     at::Tensor);

// The kinds of call the loop times, and their names in last_timings().
enum Piece : int { kNorm, kGemm, kRope, kKvWrite, kDecode, kPrefill, kAct, kPieces };
constexpr std::array<const char*, kPieces> kPieceNames = {"norm", "gemm", "rope", "kv_write", "decode_attention",
                                                          "prefill_attention", "act"};

template <class F>
c10::TypedOperatorHandle<F> op(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload).typed<F>();
}

struct Layer {
  at::Tensor input_norm, qkv, o, post_norm, gate_up, down;  // GEMM weights: oneDNN's packed layout
  std::optional<at::Tensor> qkv_bias, o_bias, gate_up_bias, down_bias;
  int64_t window;  // sliding window, -1: full causal
};

// One step's attention metadata (engine/attention/torch_paged.py's NativePlan).
struct StepAttention {
  at::Tensor slots;                                  // [rows] int64 cache slot of each new token
  std::optional<at::Tensor> decode_tables, context;  // the decode rows' int32 block tables, contexts
  std::optional<at::Tensor> prefill_tables, starts, lens;  // the prefill chunks', after the decode rows
  double scale;
};

class LayerStack {
 public:
  LayerStack(std::vector<at::Tensor> input_norm, std::vector<at::Tensor> qkv, std::vector<at::Tensor> o,
             std::vector<at::Tensor> post_norm, std::vector<at::Tensor> gate_up, std::vector<at::Tensor> down,
             std::vector<std::optional<at::Tensor>> qkv_bias, std::vector<std::optional<at::Tensor>> o_bias,
             std::vector<std::optional<at::Tensor>> gate_up_bias, std::vector<std::optional<at::Tensor>> down_bias,
             std::vector<int64_t> windows, int64_t heads, int64_t kv_heads, int64_t head_dim, double eps,
             int64_t norm_lanes, int64_t mlp_rows)
      : heads_(heads), kv_(kv_heads), hd_(head_dim), eps_(eps), lanes_(norm_lanes), mlp_rows_(mlp_rows),
        linear_(op<Linear>("mkldnn::_linear_pointwise")),
        linear_add_(op<LinearAdd>("mkldnn::_linear_pointwise", "binary")),
        write_kv_(op<WriteKv>("conveyor::write_kv")),
        decode_(op<Decode>("conveyor::paged_decode_into")),
        prefill_(op<Prefill>("conveyor::paged_prefill")) {
    const size_t n = input_norm.size();
    for (const auto* list : {&qkv, &o, &post_norm, &gate_up, &down})
      TORCH_CHECK(list->size() == n, "every weight list must have one entry per layer");
    for (const auto* list : {&qkv_bias, &o_bias, &gate_up_bias, &down_bias})
      TORCH_CHECK(list->size() == n, "every bias list must have one entry (or None) per layer");
    TORCH_CHECK(windows.size() == n, "windows must have one entry per layer");
    TORCH_CHECK(mlp_rows > 0 && heads > 0 && kv_heads > 0 && head_dim > 0, "sizes must be positive");
    for (size_t i = 0; i < n; ++i)
      layers_.push_back({input_norm[i], qkv[i], o[i], post_norm[i], gate_up[i], down[i], qkv_bias[i], o_bias[i],
                         gate_up_bias[i], down_bias[i], windows[i]});
  }

  // h [rows, hidden] (the embeddings; rows past n_real are padding) through every layer; returns the
  // last layer's output [rows, hidden]. Buffers: norm_out [rows, hidden], qk [rows, heads + kv, D],
  // act [min(rows, mlp_rows), inter], att [rows, heads, D]; cos, sin [rows, D].
  at::Tensor forward(at::Tensor h, const at::Tensor& cos, const at::Tensor& sin, int64_t n_real, at::Tensor norm_out,
                     at::Tensor qk, at::Tensor act, at::Tensor att, const std::vector<at::Tensor>& k_caches,
                     const std::vector<at::Tensor>& v_caches, const StepAttention& a) {
    const int64_t rows = h.size(0), n_decode = a.context ? a.context->numel() : 0;
    TORCH_CHECK(k_caches.size() == layers_.size() && v_caches.size() == layers_.size(), "one cache per layer");
    TORCH_CHECK(n_real > 0 && n_real <= rows && n_decode <= n_real &&
                    a.decode_tables.has_value() == a.context.has_value() &&
                    a.prefill_tables.has_value() == (n_decode < n_real) && a.starts.has_value() == a.lens.has_value() &&
                    a.starts.has_value() == a.prefill_tables.has_value(),
                "the attention plan must cover rows [0, n_real): decode rows, then the prefill chunks");
    TORCH_CHECK(att.is_contiguous() && att.size(0) == rows && qk.is_contiguous() && qk.size(0) == rows,
                "att and qk must be contiguous buffers of h's rows");
    seconds_.fill(0.0);
    if (n_real < rows) att.narrow(0, n_real, rows - n_real).zero_();  // padding: never attended
    const at::Tensor q = qk.narrow(0, 0, n_real).narrow(1, 0, heads_);
    const at::Tensor k = qk.narrow(0, 0, n_real).narrow(1, heads_, kv_);
    const at::Tensor att_rows = att.view({rows, heads_ * hd_});
    const int64_t v_col = (heads_ + kv_) * hd_;
    const c10::List<std::optional<at::Scalar>> no_scalars;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& l = layers_[i];
      timed(kNorm, [&] { rms_norm(h, l.input_norm, eps_, lanes_, norm_out); });
      const at::Tensor qkv =
          timed(kGemm, [&] { return linear_.call(norm_out, l.qkv, l.qkv_bias, "none", no_scalars, std::nullopt); });
      timed(kRope, [&] { rope(qkv, cos, sin, heads_ + kv_, qk); });
      const at::Tensor v = qkv.narrow(0, 0, n_real).narrow(1, v_col, kv_ * hd_).view({n_real, kv_, hd_});
      // Write first: every query of this step must see its own token and its chunk's earlier ones.
      timed(kKvWrite, [&] { write_kv_.call(k, v, k_caches[i], v_caches[i], a.slots); });
      if (n_decode > 0)
        timed(kDecode, [&] {
          decode_.call(q.narrow(0, 0, n_decode), k_caches[i], v_caches[i], *a.decode_tables, *a.context, a.scale,
                       l.window, att.narrow(0, 0, n_decode));
        });
      if (n_decode < n_real)
        timed(kPrefill, [&] {
          prefill_.call(q.narrow(0, n_decode, n_real - n_decode), k_caches[i], v_caches[i], *a.prefill_tables,
                        *a.starts, *a.lens, a.scale, l.window, att.narrow(0, n_decode, n_real - n_decode));
        });
      h = timed(kGemm, [&] { return linear_add_.call(att_rows, h, l.o, l.o_bias, "add"); });
      h = mlp(h, l, norm_out, act);
    }
    return h;
  }

  // Seconds of each kind of call in the last forward, by name.
  std::vector<std::pair<std::string, double>> last_timings() const {
    std::vector<std::pair<std::string, double>> out;
    for (int p = 0; p < kPieces; ++p) out.emplace_back(kPieceNames[p], seconds_[p]);
    return out;
  }

 private:
  // h + MLP(norm(h)), in slices of mlp_rows rows past that many (as Llama._mlp: the activations stay
  // in L3 rather than tens of MB mapped anew per layer).
  at::Tensor mlp(at::Tensor h, const Layer& l, at::Tensor& norm_out, at::Tensor& act) {
    const int64_t rows = h.size(0);
    const c10::List<std::optional<at::Scalar>> no_scalars;
    for (int64_t lo = 0; lo < rows; lo += mlp_rows_) {
      const int64_t n = std::min(mlp_rows_, rows - lo);
      at::Tensor x = h.narrow(0, lo, n), normed = norm_out.narrow(0, lo, n), a = act.narrow(0, 0, n);
      timed(kNorm, [&] { rms_norm(x, l.post_norm, eps_, lanes_, normed); });
      const at::Tensor gate_up = timed(
          kGemm, [&] { return linear_.call(normed, l.gate_up, l.gate_up_bias, "none", no_scalars, std::nullopt); });
      timed(kAct, [&] { silu_and_mul(gate_up, a); });
      const at::Tensor out = timed(kGemm, [&] { return linear_add_.call(a, x, l.down, l.down_bias, "add"); });
      if (n == rows) return out;
      x.copy_(out);
    }
    return h;
  }

  // f(), its wall time added to `piece`.
  template <class F>
  std::invoke_result_t<F&> timed(Piece piece, F&& f) {
    const auto start = std::chrono::steady_clock::now();
    const auto add = [&] {
      seconds_[piece] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    if constexpr (std::is_void_v<decltype(f())>) {
      f();
      add();
    } else {
      auto result = f();
      add();
      return result;
    }
  }

  std::array<double, kPieces> seconds_{};
  std::vector<Layer> layers_;
  int64_t heads_, kv_, hd_;
  double eps_;
  int64_t lanes_, mlp_rows_;
  c10::TypedOperatorHandle<Linear> linear_;
  c10::TypedOperatorHandle<LinearAdd> linear_add_;
  c10::TypedOperatorHandle<WriteKv> write_kv_;
  c10::TypedOperatorHandle<Decode> decode_;
  c10::TypedOperatorHandle<Prefill> prefill_;
};

}  // namespace

void bind_layer_loop(pybind11::module_& m) {
  namespace py = pybind11;
  py::class_<StepAttention>(m, "StepAttention", "one step's attention metadata for LayerStack.forward")
      .def(py::init<at::Tensor, std::optional<at::Tensor>, std::optional<at::Tensor>, std::optional<at::Tensor>,
                    std::optional<at::Tensor>, std::optional<at::Tensor>, double>(),
           py::arg("slots"), py::arg("decode_tables"), py::arg("context"), py::arg("prefill_tables"),
           py::arg("starts"), py::arg("lens"), py::arg("scale"));
  py::class_<LayerStack>(m, "LayerStack", "a Llama model's layers, run in one call (layer_loop.cpp)")
      .def(py::init<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>,
                    std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>,
                    std::vector<std::optional<at::Tensor>>, std::vector<std::optional<at::Tensor>>,
                    std::vector<std::optional<at::Tensor>>, std::vector<std::optional<at::Tensor>>,
                    std::vector<int64_t>, int64_t, int64_t, int64_t, double, int64_t, int64_t>(),
           py::arg("input_norm"), py::arg("qkv"), py::arg("o"), py::arg("post_norm"), py::arg("gate_up"),
           py::arg("down"), py::arg("qkv_bias"), py::arg("o_bias"), py::arg("gate_up_bias"), py::arg("down_bias"),
           py::arg("windows"), py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("eps"),
           py::arg("norm_lanes"), py::arg("mlp_rows"))
      .def("forward", &LayerStack::forward, py::call_guard<py::gil_scoped_release>(), py::arg("h"), py::arg("cos"),
           py::arg("sin"), py::arg("n_real"), py::arg("norm_out"), py::arg("qk"), py::arg("act"), py::arg("att"),
           py::arg("k_caches"), py::arg("v_caches"), py::arg("attention"))
      .def("last_timings", &LayerStack::last_timings,
           "[(piece, seconds)] of each kind of call in the last forward: norm, gemm, rope, kv_write, "
           "decode_attention, prefill_attention, act");
}
