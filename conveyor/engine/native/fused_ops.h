// The fused elementwise ops of fused_ops.cpp, for the layer loop compiled into the same extension
// (layer_loop.cpp). Their contracts are in fused_ops.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

void rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, int64_t lanes, at::Tensor& out);
void silu_and_mul(const at::Tensor& gate_up, at::Tensor& out);
void rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t heads, at::Tensor& out);

// Adds layer_loop.cpp's LayerStack to the extension's Python module.
void bind_layer_loop(pybind11::module_& m);
