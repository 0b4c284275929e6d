#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "pmap/detail/data_movement.hpp"
#include "pmap/detail/hash.hpp"
#include "pmap/detail/reductions.hpp"
#include "pmap/detail/rendezvous.hpp"
#include "pmap/ragged.hpp"

namespace pmap::detail {

std::uint64_t hash_bytes(std::uint64_t h, const void* data, std::size_t size) {
  // Eight bytes per step (a ppermute hashes its pairs on every call: 8 pairs took 64 dependent
  // multiplies byte by byte, 7% of a one-point halo exchange), the tail byte by byte.
  h ^= kHashSeed;
  const auto* bytes = static_cast<const unsigned char*>(data);
  std::size_t i = 0;
  for (; i + sizeof(std::uint64_t) <= size; i += sizeof(std::uint64_t)) {
    std::uint64_t word = 0;
    std::memcpy(&word, bytes + i, sizeof(word));
    h = hash_mix(h, word);
  }
  for (; i < size; ++i) h = (h ^ bytes[i]) * 0x100000001b3ULL;
  return h;
}

namespace {

/// The last signature op_signature() computed on this thread with at most kParams
/// parameters, and what it was computed from: a loop calls one collective many times.
struct LastSignature {
  static constexpr std::size_t kParams = 4;
  OpKind kind{};
  const char* dtype = nullptr;
  Shape shape;
  std::size_t param_count = 0;
  std::int64_t params[kParams] = {};
  std::uint64_t signature = 0;

  bool is(OpKind k, const char* d, const Shape& s, std::initializer_list<std::int64_t> p) const {
    return k == kind && d == dtype && s == shape && p.size() == param_count &&
           std::equal(p.begin(), p.end(), params);
  }
};

}  // namespace

std::uint64_t op_signature(OpKind kind, const char* dtype, const Shape& shape,
                           std::initializer_list<std::int64_t> params) {
  thread_local LastSignature last;
  if (last.is(kind, dtype, shape, params)) return last.signature;
  std::uint64_t h = hash_bytes(static_cast<std::uint64_t>(kind), dtype, std::strlen(dtype));
  h = hash_bytes(h, &shape.rank, sizeof(shape.rank));
  h = hash_bytes(h, shape.dims.data(), static_cast<std::size_t>(shape.rank) * sizeof(std::int64_t));
  for (std::int64_t p : params) h = hash_bytes(h, &p, sizeof(p));
  if (params.size() <= LastSignature::kParams) {
    last.kind = kind;
    last.dtype = dtype;
    last.shape = shape;
    last.param_count = params.size();
    std::copy(params.begin(), params.end(), last.params);
    last.signature = h;
  }
  return h;
}

namespace {

struct KeptResult {
  ResultKey key;
  std::vector<unsigned char> data;
};

KeptResult& this_threads_result() {
  static thread_local KeptResult kept;
  return kept;
}

}  // namespace

const void* kept_result(const ResultKey& key) {
  const KeptResult& kept = this_threads_result();
  return kept.key == key ? kept.data.data() : nullptr;
}

void keep_result(const ResultKey& key, const void* data) {
  KeptResult& kept = this_threads_result();
  kept.key = ResultKey{};  // invalid until the copy is complete (resize may throw)
  kept.data.resize(key.bytes);
  std::memcpy(kept.data.data(), data, key.bytes);
  kept.key = key;
}

int canonical_axis(int axis, int ndim) {
  const int a = axis < 0 ? axis + ndim : axis;
  if (a < 0 || a >= ndim)
    raise_value_error(fmt::format("axis {} is out of bounds for array of dimension {}", axis, ndim));
  return a;
}

namespace {

std::string python_pairs(const std::vector<std::pair<int, int>>& perm) {
  std::vector<std::string> items;
  for (const auto& [src, dst] : perm) items.push_back(fmt::format("({}, {})", src, dst));
  if (items.size() == 1) return fmt::format("({},)", items[0]);
  return fmt::format("({})", fmt::join(items, ", "));
}

}  // namespace

void check_permutation_pairs(const std::vector<std::pair<int, int>>& perm, const GroupInfo& g) {
  for (const auto& [src, dst] : perm)
    for (int index : {src, dst})
      if (index < 0 || index >= g.axis_size)
        raise_value_error(fmt::format(
            "ppermute index {} is out of range for axis {} of size {} (got perm {})", index,
            g.axis_label, g.axis_size, python_pairs(perm)));
  // Every ppermute validates its pairs (two vectors per call were a fifth of a one-device
  // ppermute's time): the bits of axes of up to 64 devices in two registers, a vector beyond.
  const auto n = static_cast<std::size_t>(g.axis_size);
  bool unique = true;
  if (n <= 64) {
    std::uint64_t src_seen = 0, dst_seen = 0;
    for (const auto& [src, dst] : perm) {
      const std::uint64_t s = std::uint64_t{1} << src, d = std::uint64_t{1} << dst;
      unique = unique && !(src_seen & s) && !(dst_seen & d);
      src_seen |= s;
      dst_seen |= d;
    }
  } else {
    std::vector<bool> src_seen(n), dst_seen(n);
    for (const auto& [src, dst] : perm) {
      const auto s = static_cast<std::size_t>(src), d = static_cast<std::size_t>(dst);
      unique = unique && !src_seen[s] && !dst_seen[d];
      src_seen[s] = dst_seen[d] = true;
    }
  }
  if (!unique)
    raise_value_error(
        fmt::format("ppermute sources and destinations must be unique, got {}.", python_pairs(perm)));
}

void check_shuffle(const std::vector<int>& perm, const GroupInfo& g) {
  std::vector<char> seen(perm.size(), 0);
  bool ok = static_cast<int>(perm.size()) == g.axis_size;
  for (int p : perm) {
    if (p < 0 || p >= static_cast<int>(perm.size()) || seen[static_cast<std::size_t>(p)]++) ok = false;
  }
  if (!ok)
    raise_value_error(
        fmt::format("`perm` does not represent a permutation: [{}]", fmt::join(perm, ", ")));
}

void check_ragged_sizes(std::span<const Eigen::Index> send_sizes, std::int64_t rows,
                        const GroupInfo& g) {
  const auto n = g.members.size();
  if (send_sizes.size() != n)
    raise_value_error(fmt::format("ragged_all_to_all needs one send size per member of axis {} ({}), got {}",
                                  g.axis_label, n, send_sizes.size()));
  std::int64_t sum = 0;
  for (Eigen::Index s : send_sizes) sum += s;
  if (std::any_of(send_sizes.begin(), send_sizes.end(), [](Eigen::Index s) { return s < 0; }))
    raise_value_error(fmt::format("ragged_all_to_all send sizes must be non-negative, got [{}]",
                                  fmt::join(send_sizes, ", ")));
  if (sum != rows)
    raise_value_error(
        fmt::format("ragged_all_to_all send sizes sum to {}, but x has {} rows", sum, rows));
}

void check_source(int source, const GroupInfo& g) {
  if (source < 0 || source >= g.axis_size)
    raise_value_error(fmt::format("pbroadcast source {} is out of range for axis {} of size {}",
                                  source, g.axis_label, g.axis_size));
}

}  // namespace pmap::detail
