// SPDX-License-Identifier: MIT
// trainkit/io/npy.hpp: NumPy .npy files (format versions 1, 2 and 3): a strict header parser that
// survives any input (it is fuzzed), a writer whose bytes equal numpy >= 1.24's `np.save`, and
// `NpyFile`, a memory-mapped reader. Numeric dtypes only (bool, int8..64, uint8..64, f16, f32,
// f64), little-endian, C order, bools stored as 0 or 1; everything else is refused with an Error
// naming the file.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <algorithm>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/checked.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/error.hpp"
#include "trainkit/io/atomic_file.hpp"
#include "trainkit/io/mmap.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace io {

/// What a .npy header says. `data_offset` is where the array bytes start (a multiple of 64 for
/// files numpy wrote); `data_bytes` = numel * dtype_size(dtype).
struct NpyHeader {
  DType dtype = DType::kU8;
  std::vector<std::int64_t> shape;  ///< outermost first; empty for a 0-d array (one element)
  bool fortran_order = false;       ///< as stored; accepted only where it equals C order
  int major = 1;                    ///< format version (1, 2 or 3)
  int minor = 0;
  std::size_t data_offset = 0;
  std::size_t numel = 1;
  std::size_t data_bytes = 0;
};

/// numpy refuses longer headers by default (a literal_eval guard); so do we.
inline constexpr std::size_t kNpyMaxHeaderBytes = 10000;

/// The most dimensions a .npy file may have: numpy >= 2 reads up to 64 (numpy 1.x: 32); the
/// reader refuses more and the writer will not write more.
inline constexpr std::size_t kNpyMaxDims = 64;

/// The `descr` string numpy writes for `t` ('<f4', '|u1', '|b1', ...). Throws trainkit::Error for
/// types numpy cannot represent (bf16, the float8 types).
TRAINKIT_INLINE std::string npy_descr(DType t);

namespace detail {

[[noreturn]] inline void npy_fail(std::string_view source, const std::string& what) {
  TRAINKIT_FAIL("npy file '", source, "': ", what);
}

/// A cursor over the header text; every read is bounds-checked (the input is untrusted).
struct NpyHeaderText {
  std::string_view text;
  std::size_t pos = 0;
  std::string_view source;

  [[noreturn]] void fail(const std::string& what) const {
    npy_fail(source, ::trainkit::detail::concat("corrupt header at character ", pos, ": ", what,
                                                " (header: ", shorten(), ")"));
  }
  TRAINKIT_INLINE std::string shorten() const;
  void skip_space() {
    while (pos < text.size() &&
           (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\n' || text[pos] == '\r'))
      ++pos;
  }
  bool peek(char c) {
    skip_space();
    return pos < text.size() && text[pos] == c;
  }
  void expect(char c) {
    if (!peek(c)) fail(::trainkit::detail::concat("expected '", c, "'"));
    ++pos;
  }
  TRAINKIT_INLINE std::string_view string();
  TRAINKIT_INLINE bool boolean();
  TRAINKIT_INLINE std::int64_t integer();
  TRAINKIT_INLINE std::vector<std::int64_t> tuple();
};

/// Maps a descr string to a DType, or fails saying why it is refused.
TRAINKIT_INLINE DType parse_npy_descr(std::string_view descr, std::string_view source);

inline std::uint64_t read_le(const unsigned char* p, int n) noexcept {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

/// "(2, 3)" / "(5,)" / "()": Python's tuple text, for messages.
TRAINKIT_INLINE std::string shape_text(const std::vector<std::int64_t>& shape);

/// npy_descr(t), or nullptr for a dtype numpy cannot represent.
TRAINKIT_INLINE const char* npy_descr_or_null(DType t) noexcept;

/// What is wrong with `shape` for numpy, checked extent by extent (the first problem wins).
enum class NpyShapeProblem { kNone, kNegativeExtent, kTooLarge };

/// Like numpy ("array is too big"): the byte size of the nonzero extents must fit a signed 64-bit
/// size (npy_intp), even when another extent is 0 and the array holds nothing, so every row size,
/// stride and element count derived from the shape is representable. The reader and the writer
/// share this check so that what one refuses the other never produces.
TRAINKIT_INLINE NpyShapeProblem npy_shape_problem(DType dtype,
                                                  std::span<const std::int64_t> shape) noexcept;

/// Why numpy could not load a .npy file of `dtype` and `shape` ("" when it could): the text
/// after "cannot write <file>: ".
TRAINKIT_INLINE std::string npy_unwritable(DType dtype, std::span<const std::int64_t> shape);

#if TRAINKIT_IMPL

TRAINKIT_INLINE std::string NpyHeaderText::shorten() const {
  std::string s(text.substr(0, 120));
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
  return text.size() > 120 ? s + "..." : s;
}

TRAINKIT_INLINE std::string_view NpyHeaderText::string() {
  skip_space();
  if (pos >= text.size() || (text[pos] != '\'' && text[pos] != '"')) fail("expected a string");
  const char quote = text[pos++];
  const std::size_t start = pos;
  while (pos < text.size() && text[pos] != quote) {
    if (text[pos] == '\\') fail("escapes are not supported in header strings");
    ++pos;
  }
  if (pos >= text.size()) fail("unterminated string");
  return text.substr(start, pos++ - start);
}

TRAINKIT_INLINE bool NpyHeaderText::boolean() {
  skip_space();
  if (text.substr(pos, 4) == "True") {
    pos += 4;
    return true;
  }
  if (text.substr(pos, 5) == "False") {
    pos += 5;
    return false;
  }
  fail("expected True or False");
}

TRAINKIT_INLINE std::int64_t NpyHeaderText::integer() {
  skip_space();
  const std::size_t start = pos;
  std::uint64_t v = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
    const auto digit = static_cast<std::uint64_t>(text[pos] - '0');
    if (v > (static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) - digit) / 10)
      fail("shape extent too large");
    v = v * 10 + digit;
    ++pos;
  }
  if (pos == start) fail("expected a non-negative integer in 'shape'");
  if (pos < text.size() && text[pos] == 'L') ++pos;  // Python 2 long literal
  return static_cast<std::int64_t>(v);
}

TRAINKIT_INLINE std::vector<std::int64_t> NpyHeaderText::tuple() {
  expect('(');
  std::vector<std::int64_t> dims;
  while (!peek(')')) {
    if (dims.size() >= kNpyMaxDims) fail("more than 64 dimensions");
    dims.push_back(integer());
    if (peek(',')) {
      ++pos;
    } else if (!peek(')')) {
      fail("expected ',' or ')' in 'shape'");
    }
  }
  ++pos;
  return dims;
}

TRAINKIT_INLINE DType parse_npy_descr(std::string_view descr, std::string_view source) {
  if (descr.size() >= 2 && descr[1] == 'O')
    npy_fail(source, "object arrays (descr '|O') hold pickled Python objects; refused");
  if (descr.size() < 3) npy_fail(source, ::trainkit::detail::concat("unknown descr '", descr, "'"));
  const char order = descr[0];
  const char kind = descr[1];
  const std::string_view size_text = descr.substr(2);
  if (order != '<' && order != '>' && order != '|' && order != '=')
    npy_fail(source, ::trainkit::detail::concat("unknown byte order in descr '", descr, "'"));
  int size = 0;
  for (char c : size_text) {
    if (c < '0' || c > '9' || size > 1000)
      npy_fail(source, ::trainkit::detail::concat("dtype '", descr,
                                                  "' is not a plain numeric dtype (structured, "
                                                  "datetime and string arrays are unsupported)"));
    size = size * 10 + (c - '0');
  }
  DType t = DType::kU8;
  bool known = true;
  if (kind == 'f' && size == 2) t = DType::kF16;
  else if (kind == 'f' && size == 4) t = DType::kF32;
  else if (kind == 'f' && size == 8) t = DType::kF64;
  else if (kind == 'i' && size == 1) t = DType::kI8;
  else if (kind == 'i' && size == 2) t = DType::kI16;
  else if (kind == 'i' && size == 4) t = DType::kI32;
  else if (kind == 'i' && size == 8) t = DType::kI64;
  else if (kind == 'u' && size == 1) t = DType::kU8;
  else if (kind == 'u' && size == 2) t = DType::kU16;
  else if (kind == 'u' && size == 4) t = DType::kU32;
  else if (kind == 'u' && size == 8) t = DType::kU64;
  else if (kind == 'b' && size == 1) t = DType::kBool;
  else known = false;
  if (!known) {
    npy_fail(source, ::trainkit::detail::concat(
                         "dtype '", descr, "' is not supported (",
                         kind == 'c'                    ? "complex"
                         : kind == 'V'                  ? "void/bfloat16-as-void"
                         : (kind == 'U' || kind == 'S') ? "string"
                         : (kind == 'M' || kind == 'm') ? "datetime"
                                                        : "unknown",
                         "); use bool, int8..64, uint8..64, float16, float32 or float64"));
  }
  const bool little_host = std::endian::native == std::endian::little;
  if (size > 1) {
    const bool big = order == '>' || (order == '=' && !little_host);
    if (order == '|' || big == little_host) {
      npy_fail(source,
               ::trainkit::detail::concat(
                   "dtype '", descr, "' has a byte order this ", little_host ? "little" : "big",
                   "-endian machine cannot map; save a.astype(a.dtype.newbyteorder('=')) "
                   "instead"));
    }
  }
  return t;
}

TRAINKIT_INLINE std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + (shape.size() == 1 ? ",)" : ")");
}

#endif  // TRAINKIT_IMPL

}  // namespace detail

/// Parses the .npy header at the start of `bytes` (the whole file, or at least its header) and
/// checks it: magic, version, header length, the dict `{'descr', 'fortran_order', 'shape'}` in
/// any key order, a supported dtype, C order, and sizes that do not overflow. `source` names the
/// file in messages. Does NOT check the data length: see check_npy_size(). Throws trainkit::Error.
TRAINKIT_INLINE NpyHeader parse_npy_header(std::span<const std::byte> bytes,
                                           std::string_view source);

/// "(2, 3)" style text of a header's shape, for messages.
inline std::string shape_string(const NpyHeader& h) { return detail::shape_text(h.shape); }

/// Checks that a file of `file_size` bytes holds exactly the header's data. Throws a
/// trainkit::Error saying "truncated" or "trailing bytes" with both sizes.
TRAINKIT_INLINE void check_npy_size(const NpyHeader& h, std::size_t file_size,
                                    std::string_view source);

/// Checks that a bool array's `data` (its data_bytes, or the part given) holds only 0 and 1 bytes,
/// as C++ bools must: numpy reads any nonzero byte as True, and an array made with .view(bool)
/// from other bytes saves them as they are, which would read as bools that are neither true nor
/// false. Does nothing for other dtypes. Throws a trainkit::Error naming `source`, the first bad
/// element and its byte.
TRAINKIT_INLINE void check_npy_bools(const NpyHeader& h, std::span<const std::byte> data,
                                     std::string_view source);

/// The header bytes numpy >= 1.24 writes for a C-order array of `dtype` and `shape`: the sorted
/// dict, 21 - len(str(shape[0])) spaces of growth room, padding to a multiple of 64 ending in
/// '\n'; version 1.0 unless the header needs 2.0. Data written right after it is 64-byte aligned.
/// Throws trainkit::Error for a dtype numpy lacks (npy_descr), a negative extent or more than
/// kNpyMaxDims dimensions (numpy could not load the file).
TRAINKIT_INLINE std::string npy_header_bytes(DType dtype, std::span<const std::int64_t> shape);

/// Writes a C-order array as a .npy file, byte-identical to numpy's np.save. `data` holds
/// numel(shape) * dtype_size(dtype) bytes (it may be null when that is 0). Throws trainkit::Error
/// naming the path for what npy_header_bytes refuses and on I/O failure, leaving a file already
/// at `path` as it was (the new one is renamed over it once complete).
TRAINKIT_INLINE void write_npy(const std::filesystem::path& path, DType dtype,
                               std::span<const std::int64_t> shape, const void* data);

/// Typed convenience: `write_npy(path, shape, values)` with the dtype taken from T.
template <class T>
void write_npy(const std::filesystem::path& path, std::span<const std::int64_t> shape,
               std::span<const T> values) {
  if (const std::string why = detail::npy_unwritable(dtype_of<T>, shape); !why.empty())
    TRAINKIT_FAIL("cannot write npy file '", path.string(), "': ", why);
  std::size_t numel = 1;
  for (std::int64_t d : shape)
    numel = checked_mul(numel, checked_cast<std::size_t>(d, "write_npy: extent"), "write_npy('",
                        path.string(), "'): element count");
  TRAINKIT_CHECK(values.size() == numel, "write_npy('", path.string(), "'): shape holds ", numel,
                 " elements but ", values.size(), " were given");
  write_npy(path, dtype_of<T>, shape, values.data());
}

/// A memory-mapped .npy file, validated on open (header and exact size). Move-only; the data
/// stays mapped while the object lives.
class NpyFile {
 public:
  NpyFile() = default;

  /// Maps and validates `path`. Throws trainkit::Error naming the file and the problem (not a
  /// .npy file, truncated, unsupported dtype, Fortran order, trailing bytes, a bool array holding
  /// bytes other than 0 and 1, ...). A bool array is read once here for that check; other arrays
  /// are not touched.
  explicit NpyFile(const std::filesystem::path& path, MapAccess access = MapAccess::kNormal)
      : file_(path, access) {
    header_ = parse_npy_header(file_.bytes(), file_.path());
    check_npy_size(header_, file_.size(), file_.path());
    check_npy_bools(header_, bytes(), file_.path());
  }

  const NpyHeader& header() const noexcept { return header_; }
  DType dtype() const noexcept { return header_.dtype; }
  const std::vector<std::int64_t>& shape() const noexcept { return header_.shape; }
  std::size_t numel() const noexcept { return header_.numel; }
  const std::string& path() const noexcept { return file_.path(); }
  /// The raw array bytes (C order), `header().data_bytes` long.
  const std::byte* data() const noexcept {
    return file_.data() == nullptr ? nullptr : file_.data() + header_.data_offset;
  }
  std::span<const std::byte> bytes() const noexcept { return {data(), header_.data_bytes}; }

  /// The elements as T; throws unless T is the file's dtype and the data is aligned for T.
  template <class T>
  std::span<const T> values() const {
    TRAINKIT_CHECK(dtype_of<T> == header_.dtype, "npy file '", path(), "' holds ",
                   dtype_name(header_.dtype), ", not ", dtype_name(dtype_of<T>));
    TRAINKIT_CHECK(reinterpret_cast<std::uintptr_t>(data()) % alignof(T) == 0, "npy file '", path(),
                   "': data offset ", header_.data_offset, " is not aligned for ",
                   dtype_name(header_.dtype));
    return {reinterpret_cast<const T*>(data()), header_.numel};
  }

  /// Re-advises the kernel on the access pattern (see MappedFile::advise).
  void advise(MapAccess access) const noexcept { file_.advise(access); }

 private:
  MappedFile file_;
  NpyHeader header_;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE const char* detail::npy_descr_or_null(DType t) noexcept {
  switch (t) {
    case DType::kF64: return "<f8";
    case DType::kF32: return "<f4";
    case DType::kF16: return "<f2";
    case DType::kI64: return "<i8";
    case DType::kI32: return "<i4";
    case DType::kI16: return "<i2";
    case DType::kI8: return "|i1";
    case DType::kU64: return "<u8";
    case DType::kU32: return "<u4";
    case DType::kU16: return "<u2";
    case DType::kU8: return "|u1";
    case DType::kBool: return "|b1";
    default: return nullptr;
  }
}

TRAINKIT_INLINE detail::NpyShapeProblem detail::npy_shape_problem(
    DType dtype, std::span<const std::int64_t> shape) noexcept {
  std::int64_t nonzero_bytes = std::int64_t(dtype_size(dtype));
  for (std::int64_t d : shape) {
    if (d < 0) return NpyShapeProblem::kNegativeExtent;
    const std::optional<std::int64_t> next = checked_mul(nonzero_bytes, d == 0 ? 1 : d);
    if (!next) return NpyShapeProblem::kTooLarge;
    nonzero_bytes = *next;
  }
  return NpyShapeProblem::kNone;
}

TRAINKIT_INLINE std::string detail::npy_unwritable(DType dtype,
                                                   std::span<const std::int64_t> shape) {
  using ::trainkit::detail::concat;
  if (npy_descr_or_null(dtype) == nullptr)
    return concat("dtype ", dtype_name(dtype),
                  " has no .npy descr (numpy has no bfloat16/float8): "
                  "store the raw bits as '<u2' / '|u1' or convert to float32");
  if (shape.size() > kNpyMaxDims)
    return concat("shape of ", shape.size(), " dimensions; numpy reads at most ", kNpyMaxDims);
  const NpyShapeProblem problem = npy_shape_problem(dtype, shape);
  if (problem == NpyShapeProblem::kNone) return {};
  const bool negative = problem == NpyShapeProblem::kNegativeExtent;
  return concat(negative ? "negative extent in shape " : "shape ",
                shape_text(std::vector<std::int64_t>(shape.begin(), shape.end())),
                negative ? "" : " is too large: its byte size overflows 2^63 - 1");
}

TRAINKIT_INLINE std::string npy_descr(DType t) {
  if (const char* descr = detail::npy_descr_or_null(t)) return descr;
  TRAINKIT_FAIL(detail::npy_unwritable(t, {}));
}

TRAINKIT_INLINE NpyHeader parse_npy_header(std::span<const std::byte> bytes,
                                           std::string_view source) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  static constexpr unsigned char kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (n < 10)
    detail::npy_fail(source, ::trainkit::detail::concat(
                                 "truncated: ", n, " bytes, shorter than the 10-byte preamble"));
  if (std::memcmp(p, kMagic, 6) != 0)
    detail::npy_fail(source,
                     "bad magic: the file does not start with \\x93NUMPY (not a .npy file)");
  NpyHeader h;
  h.major = p[6];
  h.minor = p[7];
  if (h.major < 1 || h.major > 3 || h.minor != 0)
    detail::npy_fail(source, ::trainkit::detail::concat("unsupported format version ", h.major, ".",
                                                        h.minor, " (expected 1.0, 2.0 or 3.0)"));
  const std::size_t len_size = h.major == 1 ? 2 : 4;
  if (n < 8 + len_size) detail::npy_fail(source, "truncated inside the header-length field");
  const std::size_t hlen = static_cast<std::size_t>(detail::read_le(p + 8, int(len_size)));
  if (hlen > kNpyMaxHeaderBytes)
    detail::npy_fail(source, ::trainkit::detail::concat("header length ", hlen, " exceeds the ",
                                                        kNpyMaxHeaderBytes, "-byte limit"));
  h.data_offset = 8 + len_size + hlen;
  if (n < h.data_offset)
    detail::npy_fail(source, ::trainkit::detail::concat("truncated header: needs ", h.data_offset,
                                                        " bytes, the file has ", n));
  std::string_view text(reinterpret_cast<const char*>(p + 8 + len_size), hlen);
  // Writers end the header with '\n'; numpy's reader does not insist, and neither do we.
  detail::NpyHeaderText in{text, 0, source};
  bool have_descr = false, have_order = false, have_shape = false;
  std::string_view descr;
  in.expect('{');
  while (!in.peek('}')) {
    const std::string_view key = in.string();
    in.expect(':');
    if (key == "descr") {
      if (have_descr) in.fail("duplicate key 'descr'");
      if (in.peek('[')) {
        detail::npy_fail(source, "structured dtypes (a list 'descr') are not supported");
      }
      descr = in.string();
      have_descr = true;
    } else if (key == "fortran_order") {
      if (have_order) in.fail("duplicate key 'fortran_order'");
      h.fortran_order = in.boolean();
      have_order = true;
    } else if (key == "shape") {
      if (have_shape) in.fail("duplicate key 'shape'");
      h.shape = in.tuple();
      have_shape = true;
    } else {
      in.fail(::trainkit::detail::concat("unexpected key '", key,
                                         "' (numpy allows only descr, fortran_order, shape)"));
    }
    if (in.peek(',')) {
      ++in.pos;
    } else if (!in.peek('}')) {
      in.fail("expected ',' or '}'");
    }
  }
  ++in.pos;
  in.skip_space();
  if (in.pos != text.size()) in.fail("trailing characters after the dict");
  if (!have_descr || !have_order || !have_shape)
    detail::npy_fail(source, ::trainkit::detail::concat("corrupt header: missing key '",
                                                        !have_descr   ? "descr"
                                                        : !have_order ? "fortran_order"
                                                                      : "shape",
                                                        "'"));
  h.dtype = detail::parse_npy_descr(descr, source);
  // The tuple parser reads no sign, so the only problem left is a byte size past 2^63 - 1; once
  // that is ruled out, the products below cannot overflow.
  if (detail::npy_shape_problem(h.dtype, h.shape) != detail::NpyShapeProblem::kNone)
    detail::npy_fail(source, ::trainkit::detail::concat(
                                 "shape ", detail::shape_text(h.shape), " of ", dtype_name(h.dtype),
                                 " is too large: its byte size overflows 2^63 - 1 "
                                 "(truncated or corrupt header)"));
  std::size_t numel = 1;
  int big_dims = 0;
  for (std::int64_t d : h.shape) {
    numel *= static_cast<std::size_t>(d);
    big_dims += d > 1 ? 1 : 0;
  }
  if (h.fortran_order && big_dims > 1) {
    detail::npy_fail(source,
                     "Fortran-order (column-major) arrays are not supported; "
                     "save with np.save(path, np.ascontiguousarray(a))");
  }
  h.numel = numel;
  h.data_bytes = numel * dtype_size(h.dtype);
  return h;
}

TRAINKIT_INLINE void check_npy_size(const NpyHeader& h, std::size_t file_size,
                                    std::string_view source) {
  // An end past 2^64 is simply more than any file holds.
  const std::optional<std::size_t> expected = checked_add(h.data_offset, h.data_bytes);
  if (!expected || file_size < *expected) {
    detail::npy_fail(source,
                     ::trainkit::detail::concat(
                         "truncated: the header promises ", h.data_bytes, " data bytes (shape ",
                         shape_string(h), ", ", dtype_name(h.dtype), ") but only ",
                         file_size - std::min(file_size, h.data_offset), " follow it"));
  }
  const std::size_t end = *expected;
  if (file_size > end) {
    detail::npy_fail(source, ::trainkit::detail::concat("corrupt: ", file_size - end,
                                                        " trailing bytes after the ", h.data_bytes,
                                                        " data bytes the header describes"));
  }
}

TRAINKIT_INLINE void check_npy_bools(const NpyHeader& h, std::span<const std::byte> data,
                                     std::string_view source) {
  if (h.dtype != DType::kBool) return;
  data = data.first(std::min(data.size(), h.data_bytes));
  const std::size_t i = ::trainkit::detail::first_non_bool_byte(data);
  if (i == data.size()) return;
  detail::npy_fail(source,
                   ::trainkit::detail::concat(
                       "bool element ", i, " holds the byte ", std::to_integer<unsigned>(data[i]),
                       "; a bool array must hold only 0 and 1 (numpy reads any nonzero "
                       "byte as True): save it with np.save(path, a != 0)"));
}

TRAINKIT_INLINE std::string npy_header_bytes(DType dtype, std::span<const std::int64_t> shape) {
  if (const std::string why = detail::npy_unwritable(dtype, shape); !why.empty())
    TRAINKIT_FAIL("npy_header_bytes: ", why);
  std::string dict = "{'descr': '" + npy_descr(dtype) + "', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) dict += ", ";
    dict += std::to_string(shape[i]);
  }
  dict += shape.size() == 1 ? ",), }" : "), }";
  if (!shape.empty()) dict.append(21 - std::to_string(shape[0]).size(), ' ');
  const std::size_t hlen = dict.size() + 1;
  int major = 1;
  std::size_t pad = 64 - (6 + 2 + 2 + hlen) % 64;
  if (hlen + pad > 0xffff) {
    major = 2;
    pad = 64 - (6 + 2 + 4 + hlen) % 64;
  }
  const std::size_t total = hlen + pad;
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  for (std::size_t i = 0; i < (major == 1 ? 2u : 4u); ++i)
    out += static_cast<char>((total >> (8 * i)) & 0xff);
  out += dict;
  out.append(pad, ' ');
  out += '\n';
  return out;
}

TRAINKIT_INLINE void write_npy(const std::filesystem::path& path, DType dtype,
                               std::span<const std::int64_t> shape, const void* data) {
  if (const std::string why = detail::npy_unwritable(dtype, shape); !why.empty())
    TRAINKIT_FAIL("cannot write npy file '", path.string(), "': ", why);
  const std::string header = npy_header_bytes(dtype, shape);
  std::size_t bytes = dtype_size(dtype);
  for (std::int64_t d : shape)
    bytes = checked_mul(bytes, checked_cast<std::size_t>(d, "write_npy: extent"), "write_npy('",
                        path.string(), "'): array bytes");
  // Written beside the path and renamed over it: a failed write leaves the old file as it was.
  AtomicFile out(path, AtomicFileOptions{.durable = false});
  out.write(header.data(), header.size());
  if (bytes != 0) out.write(data, bytes);
  out.commit();
}

#endif  // TRAINKIT_IMPL

}  // namespace io
TRAINKIT_NAMESPACE_END
