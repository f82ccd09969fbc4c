#include "model/weights_io.h"

#include <cstring>
#include <set>
#include <sstream>

#include "core/error.h"

namespace jtok {

static std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ")";
  return os.str();
}

void load_weights(Model& m, const StFile& f, const std::string& origin) {
  std::set<std::string> expected;
  for (const auto& p : m.layout) {
    expected.insert(p.name);
    auto it = f.tensors.find(p.name);
    if (it == f.tensors.end()) fail(origin, ": missing tensor ", p.name);
    const auto& t = it->second;
    if (t.dtype != "F32") fail(origin, ": tensor ", p.name, " has dtype ", t.dtype, ", expected F32");
    if (t.shape != p.shape)
      fail(origin, ": tensor ", p.name, " has shape ", shape_str(t.shape), ", the config needs ", shape_str(p.shape));
    std::memcpy(m.params.data() + p.offset, t.bytes.data(), sizeof(float) * p.numel);
  }
  for (const auto& [name, t] : f.tensors)
    if (!expected.count(name)) fail(origin, ": unexpected tensor ", name, " (config and weights disagree?)");
}

StFile weights_to_st(const Model& m, const std::vector<float>& buffer, const std::string& prefix) {
  StFile f;
  for (const auto& p : m.layout) f.tensors[prefix + p.name] = st_f32(p.shape, buffer.data() + p.offset);
  return f;
}

}  // namespace jtok
