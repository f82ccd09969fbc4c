// The element formats of stored matrices: token tables, low-precision weights and the KV cache.
// f32; bf16 (the top half of an f32, rounded to nearest even); int8 with one f32 scale a row; int4
// (token tables only) with one f32 scale a row, two values a byte.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>

namespace jtok {

enum class Dtype : uint8_t { f32, bf16, int8, int4 };

const char* dtype_name(Dtype t);  // "f32", "bf16", "int8", "int4"
// Bytes per element: 4, 2, 1. int4 has no whole byte per element: it fails (use dtype_row_bytes).
int64_t dtype_bytes(Dtype t);
// Bytes of a row of n elements: n * dtype_bytes(t); int4 (n + 1) / 2 (element 2i in the low half of
// byte i, 2i + 1 in the high half; an odd row's last high half is zero).
int64_t dtype_row_bytes(Dtype t, int64_t n);
// int8 and int4 rows carry one f32 scale each.
inline bool dtype_scaled(Dtype t) { return t == Dtype::int8 || t == Dtype::int4; }

// "f32" | "bf16" | "int8" (| "int4"), restricted to `allowed` (the KV cache takes only f32 and
// bf16, weights no int4); else a jtok::Error naming `what` (the option or field), the value and the
// allowed names.
Dtype parse_dtype(const std::string& s, const std::string& what,
                  std::initializer_list<Dtype> allowed = {Dtype::f32, Dtype::bf16, Dtype::int8});

}  // namespace jtok
