#include "scaling/table.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace jtok {

namespace {
std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && (s[a] == ' ' || s[a] == '\t' || s[a] == '\r')) ++a;
  while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t' || s[b - 1] == '\r')) --b;
  return s.substr(a, b - a);
}
std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : line) {
    if (c == ',') out.push_back(trim(cur)), cur.clear();
    else cur += c;
  }
  out.push_back(trim(cur));
  return out;
}
}  // namespace

bool CsvTable::has(const std::string& col) const {
  for (auto& c : columns)
    if (c == col) return true;
  return false;
}

size_t CsvTable::index(const std::string& col) const {
  for (size_t i = 0; i < columns.size(); ++i)
    if (columns[i] == col) return i;
  std::string have;
  for (auto& c : columns) have += (have.empty() ? "" : ", ") + c;
  fail(path, ": missing column '", col, "' (columns: ", have, ")");
}

const std::string& CsvTable::cell(size_t row, const std::string& col) const { return rows.at(row)[index(col)]; }

double CsvTable::number(size_t row, const std::string& col) const {
  const std::string& s = cell(row, col);
  const char* p = s.c_str();
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(p, &end);
  if (s.empty() || end != p + s.size() || errno == ERANGE || !std::isfinite(v))
    fail(path, ":", line_of_row[row], ": column '", col, "': not a finite number: '", s, "'");
  return v;
}

std::vector<double> CsvTable::numbers(const std::string& col) const {
  index(col);  // fail early on a missing column, even for an empty table
  std::vector<double> v(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) v[i] = number(i, col);
  return v;
}

CsvTable parse_csv(const std::string& text, const std::string& origin) {
  CsvTable t;
  t.path = origin;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    std::string s = trim(line);
    if (s.empty() || s[0] == '#') continue;
    auto cells = split(s);
    if (t.columns.empty()) {
      for (size_t i = 0; i < cells.size(); ++i) {
        if (cells[i].empty()) fail(origin, ":", lineno, ": empty column name in the header (field ", i + 1, ")");
        for (size_t j = 0; j < i; ++j)
          if (cells[j] == cells[i]) fail(origin, ":", lineno, ": duplicate column '", cells[i], "' in the header");
      }
      t.columns = cells;
      continue;
    }
    if (cells.size() != t.columns.size())
      fail(origin, ":", lineno, ": expected ", t.columns.size(), " fields (as the header), got ", cells.size());
    t.rows.push_back(std::move(cells));
    t.line_of_row.push_back(lineno);
  }
  if (t.columns.empty()) fail(origin, ": empty table (no header row)");
  return t;
}

CsvTable read_csv(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open file: ", std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_csv(ss.str(), path);
}

std::string to_csv(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    for (size_t i = 0; i < cells.size(); ++i) out += (i ? "," : "") + cells[i];
    out += '\n';
  };
  line(header);
  for (auto& r : rows) line(r);
  return out;
}

std::string fmt_double(double v) {
  char buf[64];
  for (int prec = 6; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

}  // namespace jtok
