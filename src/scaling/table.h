// A small numeric CSV table: a header row of column names, then rows of values.
// Blank lines and lines starting with '#' are skipped. Errors name the file, line and column.
#pragma once
#include <string>
#include <vector>

namespace jtok {

struct CsvTable {
  std::string path;                         // for error messages
  std::vector<std::string> columns;         // header names, trimmed
  std::vector<std::vector<std::string>> rows;  // raw cells, trimmed; each row has columns.size() cells
  std::vector<int> line_of_row;             // 1-based file line of each row

  bool has(const std::string& col) const;
  // Index of a column; fails "FILE: missing column 'col' (columns: a, b)" when absent.
  size_t index(const std::string& col) const;
  // The whole column as numbers; fails "FILE:LINE: column 'col': not a number: 'x'".
  std::vector<double> numbers(const std::string& col) const;
  double number(size_t row, const std::string& col) const;
  const std::string& cell(size_t row, const std::string& col) const;
};

// Reads a CSV file; fails on a missing/unreadable file, an empty file, or a row with the wrong
// number of fields.
CsvTable read_csv(const std::string& path);
CsvTable parse_csv(const std::string& text, const std::string& origin);

// Writes rows of cells with a header (no quoting: cells must not contain commas or newlines).
std::string to_csv(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

// Shortest text that reads back as the same double ("%.17g" trimmed).
std::string fmt_double(double v);

}  // namespace jtok
