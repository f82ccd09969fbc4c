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

void copy_tensor(const StFile& f, const std::string& name, const std::vector<int64_t>& shape, float* dst,
                 const std::string& origin) {
  auto it = f.tensors.find(name);
  if (it == f.tensors.end()) fail(origin, ": missing tensor ", name);
  const auto& t = it->second;
  if (t.dtype != "F32") fail(origin, ": tensor ", name, " has dtype ", t.dtype, ", expected F32");
  if (t.shape != shape)
    fail(origin, ": tensor ", name, " has shape ", shape_str(t.shape), ", the config needs ", shape_str(shape));
  std::memcpy(dst, t.bytes.data(), t.bytes.size());
}

void load_weights(Model& m, const StFile& f, const std::string& origin) {
  std::set<std::string> expected;
  for (const auto& p : m.layout) {
    expected.insert(p.name);
    copy_tensor(f, p.name, p.shape, m.params.data() + p.offset, origin);
  }
  for (size_t k = 0; k < m.tables.size(); ++k) {
    auto& t = m.tables[k];
    expected.insert(m.table_names[k]);
    copy_tensor(f, m.table_names[k], {t.rows, t.dim}, t.w.data(), origin);
  }
  for (const auto& [name, t] : f.tensors)
    if (!expected.count(name)) fail(origin, ": unexpected tensor ", name, " (config and weights disagree?)");
}

StFile flat_to_st(const Model& m, const std::vector<float>& buffer, const std::string& prefix) {
  StFile f;
  for (const auto& p : m.layout) f.tensors[prefix + p.name] = st_f32(p.shape, buffer.data() + p.offset);
  return f;
}

StFile tables_to_st(const Model& m, const std::vector<std::vector<float>>& per_table, const std::string& prefix) {
  StFile f;
  for (size_t k = 0; k < m.tables.size(); ++k)
    f.tensors[prefix + m.table_names[k]] = st_f32({m.tables[k].rows, m.tables[k].dim}, per_table[k].data());
  return f;
}

StFile weights_to_st(const Model& m) {
  StFile f = flat_to_st(m, m.params, "");
  for (size_t k = 0; k < m.tables.size(); ++k)
    f.tensors[m.table_names[k]] = st_f32({m.tables[k].rows, m.tables[k].dim}, m.tables[k].w.data());
  return f;
}

StFile grads_to_st(const Model& m, const std::string& prefix) {
  StFile f = flat_to_st(m, m.grads, prefix);
  for (size_t k = 0; k < m.tables.size(); ++k) {
    std::vector<float> dense = densify(m.table_grads[k], m.tables[k].rows);
    f.tensors[prefix + m.table_names[k]] = st_f32({m.tables[k].rows, m.tables[k].dim}, dense.data());
  }
  return f;
}

}  // namespace jtok
