// A safetensors file written tensor by tensor from a producer of chunks, so that no tensor (let
// alone the file) is ever whole in memory: the same bytes write_safetensors gives the same tensors
// (io/safetensors.h, safetensors_layout). The caller writes into a temp directory it renames.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "io/safetensors.h"

namespace jtok {

// Called once per tensor, in file order; it must call `put` with the tensor's bytes, in order,
// in as many pieces as it likes (their total is checked against the tensor's size).
using StProducer = std::function<void(const std::string& name, const std::function<void(std::string_view bytes)>& put)>;

// Writes and fsyncs `path`; returns its size. Errors name the path (and the tensor when its
// producer gives the wrong number of bytes).
uint64_t write_safetensors_streamed(const std::string& path, const std::map<std::string, StShape>& tensors,
                                    const std::map<std::string, std::string>& metadata, const StProducer& produce);

}  // namespace jtok
