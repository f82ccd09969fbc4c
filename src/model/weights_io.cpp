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

// dtype F32 and the expected shape, or an error naming origin and tensor.
static void check_f32(const std::string& dtype, const std::vector<int64_t>& have, const std::string& name,
                      const std::vector<int64_t>& shape, const std::string& origin) {
  if (dtype != "F32") fail(origin, ": tensor ", name, " has dtype ", dtype, ", expected F32");
  if (have != shape)
    fail(origin, ": tensor ", name, " has shape ", shape_str(have), ", the config needs ", shape_str(shape));
}

void copy_tensor(const StFile& f, const std::string& name, const std::vector<int64_t>& shape, float* dst,
                 const std::string& origin) {
  auto it = f.tensors.find(name);
  if (it == f.tensors.end()) fail(origin, ": missing tensor ", name);
  check_f32(it->second.dtype, it->second.shape, name, shape, origin);
  std::memcpy(dst, it->second.bytes.data(), it->second.bytes.size());
}

void read_tensor_f32(const StIndex& f, const std::string& name, const std::vector<int64_t>& shape, float* dst) {
  auto it = f.tensors.find(name);
  if (it == f.tensors.end()) fail(f.path, ": missing tensor ", name);
  check_f32(it->second.dtype, it->second.shape, name, shape, f.path);
  read_tensor_bytes(f, name, dst);
}

// Every parameter of m (tables included) through copy(name, shape, dst); then no tensor of the file
// may be left over.
template <typename Copy, typename Tensors>
static void load_each(Model& m, const Tensors& in_file, const std::string& origin, Copy copy) {
  std::set<std::string> expected;
  for (const auto& p : m.layout) {
    expected.insert(p.name);
    copy(p.name, p.shape, m.params.data() + p.offset);
  }
  for (size_t k = 0; k < m.tables.size(); ++k) {
    auto& t = m.tables[k];
    expected.insert(m.table_names[k]);
    copy(m.table_names[k], {t.rows, t.dim}, t.mutable_data());
  }
  for (const auto& kv : in_file)
    if (!expected.count(kv.first)) fail(origin, ": unexpected tensor ", kv.first, " (config and weights disagree?)");
}

void load_weights(Model& m, const StFile& f, const std::string& origin) {
  load_each(m, f.tensors, origin, [&](const std::string& name, const std::vector<int64_t>& shape, float* dst) {
    copy_tensor(f, name, shape, dst, origin);
  });
}

std::string table_scale_name(const std::string& table) { return table + "_scale"; }

// A token table's safetensors dtype: int4 rows are stored as U8 (two values a byte, rows of
// (dim + 1) / 2 bytes: safetensors has no 4-bit type).
static const char* table_st_dtype(Dtype dt) {
  return dt == Dtype::f32 ? "F32" : dt == Dtype::bf16 ? "BF16" : dt == Dtype::int8 ? "I8" : "U8";
}

Dtype table_dtype_in_file(const StIndex& f, const std::string& name, int64_t rows, int64_t dim) {
  auto it = f.tensors.find(name);
  if (it == f.tensors.end()) fail(f.path, ": missing tensor ", name);
  const StEntry& e = it->second;
  Dtype dt = Dtype::f32;
  for (Dtype t : {Dtype::f32, Dtype::bf16, Dtype::int8, Dtype::int4})
    if (e.dtype == table_st_dtype(t)) dt = t;
  if (e.dtype != table_st_dtype(dt))
    fail(f.path, ": token table ", name, " has dtype ", e.dtype, ", expected F32, BF16, I8 or U8 (int4, two values a byte)");
  const std::vector<int64_t> want{rows, dt == Dtype::int4 ? dtype_row_bytes(dt, dim) : dim};
  if (e.shape != want)
    fail(f.path, ": tensor ", name, " has shape ", shape_str(e.shape), ", the config needs ", shape_str(want),
         dt == Dtype::int4 ? " (int4: (dim + 1) / 2 bytes a row)" : "");
  if (dtype_scaled(dt)) {
    auto sc = f.tensors.find(table_scale_name(name));
    if (sc == f.tensors.end())
      fail(f.path, ": ", dtype_name(dt), " token table ", name, " has no per-row scales (", table_scale_name(name), ")");
    check_f32(sc->second.dtype, sc->second.shape, sc->first, {rows}, f.path);
  }
  return dt;
}

void load_weights(Model& m, const StIndex& f, bool tables, bool tables_in_file) {
  JTOK_CHECK(tables_in_file || !tables, "load_weights: tables to read from a file without tables");
  std::set<std::string> expected;
  for (const auto& p : m.layout) {
    expected.insert(p.name);
    // Read into its own buffer; its fp32 slot stays zero and unwritten (so never resident).
    if (take_lowp_matrix(m, f, p.name, p.shape, nullptr, expected)) continue;
    read_tensor_f32(f, p.name, p.shape, m.params.data() + p.offset);
  }
  for (size_t k = 0; k < m.tables.size(); ++k) {
    auto& t = m.tables[k];
    const std::string& name = m.table_names[k];
    if (!tables_in_file) continue;
    expected.insert(name);
    const Dtype dt = table_dtype_in_file(f, name, t.rows, t.dim);
    if (!tables) {  // checked only: each rank of an embedding-parallel run reads its own rows
      if (dt != Dtype::f32) fail(f.path, ": token table ", name, " is ", dtype_name(dt), "; training needs f32 tables");
      continue;
    }
    if (dt == Dtype::f32) {
      read_tensor_bytes(f, name, t.mutable_data());
      continue;
    }
    std::vector<uint8_t> bytes(static_cast<size_t>(t.rows * dtype_row_bytes(dt, t.dim)));
    read_tensor_bytes(f, name, bytes.data());
    std::vector<float> scales;
    if (dtype_scaled(dt)) {
      expected.insert(table_scale_name(name));
      scales.resize(static_cast<size_t>(t.rows));
      read_tensor_bytes(f, table_scale_name(name), scales.data());
    }
    t = TokenTable::quantized_in_ram(t.rows, t.dim, dt, std::move(bytes), std::move(scales));
  }
  for (const auto& kv : f.tensors)
    if (!expected.count(kv.first)) fail(f.path, ": unexpected tensor ", kv.first, " (config and weights disagree?)");
}

void load_weights_mapped(Model& m, const std::shared_ptr<const MappedFile>& file) {
  const StIndex idx = read_safetensors_index(file->path());
  if (idx.file_size != file->size())
    fail(file->path(), " changed while being loaded (", idx.file_size, " bytes, mapped ", file->size(), ")");
  std::set<std::string> expected;
  for (const auto& p : m.layout) {  // the backbone: read into RAM (not through the mapping)
    expected.insert(p.name);
    if (take_lowp_matrix(m, idx, p.name, p.shape, file, expected)) continue;  // viewed in the mapping
    read_tensor_f32(idx, p.name, p.shape, m.params.data() + p.offset);
  }
  for (size_t k = 0; k < m.tables.size(); ++k) {
    const int64_t rows = m.tables[k].rows, dim = m.tables[k].dim;
    const std::string& name = m.table_names[k];
    expected.insert(name);
    const Dtype dt = table_dtype_in_file(idx, name, rows, dim);
    const StEntry& t = idx.tensors.at(name);
    if (t.offset % static_cast<uint64_t>(dt == Dtype::int4 ? 1 : dtype_bytes(dt)) != 0)
      fail(idx.path, ": tensor ", name, " starts at byte ", t.offset, ", not aligned to its ", dtype_name(dt),
           " elements: cannot be read in place");
    const float* scales = nullptr;
    if (dtype_scaled(dt)) {
      const std::string sn = table_scale_name(name);
      expected.insert(sn);
      const StEntry& se = idx.tensors.at(sn);
      if (se.offset % alignof(float) != 0)
        fail(idx.path, ": tensor ", sn, " starts at byte ", se.offset, ", not float-aligned: cannot be read in place");
      scales = reinterpret_cast<const float*>(file->data() + se.offset);
    }
    m.tables[k] = TokenTable::view(rows, dim, dt, file->data() + t.offset, scales, file);
  }
  for (const auto& kv : idx.tensors)
    if (!expected.count(kv.first)) fail(idx.path, ": unexpected tensor ", kv.first, " (config and weights disagree?)");
}

StFile flat_to_st(const Model& m, std::span<const float> buffer, const std::string& prefix) {
  StFile f;
  for (const auto& p : m.layout) f.tensors[prefix + p.name] = st_f32(p.shape, buffer.data() + p.offset);
  return f;
}

StFile flat_to_st(const Model& m, std::span<const float> buffer, const std::string& prefix,
                  const std::vector<int64_t>& offsets) {
  StFile f;
  for (size_t i = 0; i < m.layout.size(); ++i)
    if (offsets.at(i) >= 0) f.tensors[prefix + m.layout[i].name] = st_f32(m.layout[i].shape, buffer.data() + offsets[i]);
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
  for (size_t k = 0; k < m.tables.size(); ++k) {
    const TokenTable& t = m.tables[k];
    if (t.trained_in_store()) continue;  // its rows are in the training store, not copied into the checkpoint
    if (t.dtype() == Dtype::f32) {
      f.tensors[m.table_names[k]] = st_f32({t.rows, t.dim}, t.data());
      continue;
    }
    const char* raw = static_cast<const char*>(t.raw_row(0));
    const int64_t cols = t.dtype() == Dtype::int4 ? t.row_stride_bytes() : t.dim;  // int4: U8 bytes, two values each
    f.tensors[m.table_names[k]] = StTensor{table_st_dtype(t.dtype()), {t.rows, cols},
                                           std::string(raw, raw + t.rows * t.row_stride_bytes())};
    if (dtype_scaled(t.dtype())) f.tensors[table_scale_name(m.table_names[k])] = st_f32({t.rows}, t.scales());
  }
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
