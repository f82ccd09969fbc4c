#include "core/dtype.h"

#include "core/error.h"

namespace jtok {

const char* dtype_name(Dtype t) {
  switch (t) {
    case Dtype::f32: return "f32";
    case Dtype::bf16: return "bf16";
    case Dtype::int8: return "int8";
    case Dtype::int4: return "int4";
  }
  return "?";
}

int64_t dtype_bytes(Dtype t) {
  if (t == Dtype::int4) fail("int4 packs two elements a byte: its sizes come from dtype_row_bytes");
  return t == Dtype::f32 ? 4 : t == Dtype::bf16 ? 2 : 1;
}

int64_t dtype_row_bytes(Dtype t, int64_t n) { return t == Dtype::int4 ? (n + 1) / 2 : n * dtype_bytes(t); }

Dtype parse_dtype(const std::string& s, const std::string& what, std::initializer_list<Dtype> allowed) {
  std::string names;
  for (Dtype t : allowed) {
    if (s == dtype_name(t)) return t;
    names += names.empty() ? "" : ", ";
    names += dtype_name(t);
  }
  fail(what, ": dtype '", s, "' is not one of ", names);
}

}  // namespace jtok
