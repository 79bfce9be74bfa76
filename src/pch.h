// Precompiled header: the heavy LibTorch headers every translation unit of the library uses.
// Only a build-speed device; each source file still includes what it needs.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/dropout.h>
#include <torch/serialize/archive.h>
#include <nlohmann/json.hpp>
#include <fmt/format.h>
