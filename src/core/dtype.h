// The element formats of stored matrices: token tables, low-precision weights and the KV cache.
// f32; bf16 (the top half of an f32, rounded to nearest even); int8 with one f32 scale a row.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>

namespace jtok {

enum class Dtype : uint8_t { f32, bf16, int8 };

const char* dtype_name(Dtype t);  // "f32", "bf16", "int8"
int64_t dtype_bytes(Dtype t);     // bytes per element: 4, 2, 1

// "f32" | "bf16" | "int8", restricted to `allowed` (the KV cache takes only f32 and bf16); else a
// jtok::Error naming `what` (the option or field), the value and the allowed names.
Dtype parse_dtype(const std::string& s, const std::string& what,
                  std::initializer_list<Dtype> allowed = {Dtype::f32, Dtype::bf16, Dtype::int8});

}  // namespace jtok
