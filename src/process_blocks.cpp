#include "pmap/detail/process_blocks.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "pmap/detail/distributed.hpp"
#include "pmap/detail/errors.hpp"
#include "pmap/detail/hash.hpp"
#include "pmap/errors.hpp"

namespace pmap::detail {
namespace {

/// The kind of a process's error, carried in its header's device field.
enum class ErrorKind : std::int32_t { value = 0, type = 1, name = 2, other = 3 };

std::pair<ErrorKind, std::string> describe_error(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const NameError& e) {
    return {ErrorKind::name, e.what()};
  } catch (const TypeError& e) {
    return {ErrorKind::type, e.what()};
  } catch (const ValueError& e) {
    return {ErrorKind::value, e.what()};
  } catch (const std::exception& e) {
    return {ErrorKind::other, e.what()};
  } catch (...) {
    return {ErrorKind::other, "an exception that is not a std::exception"};
  }
}

template <class T>
void put(std::string& out, const T& value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

/// Reads what put() wrote (zeros past the end: a payload is only read once its sender is
/// known to have sent the same structure).
class Reader {
 public:
  explicit Reader(const std::string& bytes) : bytes_(bytes) {}
  template <class T>
  T get() {
    T value{};
    if (at_ + sizeof value <= bytes_.size()) std::memcpy(&value, bytes_.data() + at_, sizeof value);
    at_ += sizeof value;
    return value;
  }
  std::string text(std::size_t size) {
    const std::size_t from = std::min(at_, bytes_.size());
    at_ += size;
    return bytes_.substr(from, size);
  }

 private:
  const std::string& bytes_;
  std::size_t at_ = 0;
};

void put_shape(std::string& out, const Shape& shape) {
  put(out, static_cast<std::int32_t>(shape.rank));
  for (int d = 0; d < shape.rank; ++d) put(out, shape.dims[static_cast<std::size_t>(d)]);
}
Shape get_shape(Reader& in) {
  Shape shape;
  shape.rank = std::clamp(in.get<std::int32_t>(), 0, kMaxRank);
  for (int d = 0; d < shape.rank; ++d) shape.dims[static_cast<std::size_t>(d)] = in.get<std::int64_t>();
  return shape;
}

/// One round between the processes: every header, then every message (this process's
/// error text when it failed, else `payload`).
struct Round {
  std::vector<mpi::Header> headers;
  std::vector<std::string> messages;
};
Round exchange(const std::exception_ptr& error, std::uint64_t signature, const std::string& payload,
               const char* where) {
  mpi::Header mine;
  std::string text = payload;
  if (error) {
    auto [kind, message] = describe_error(error);
    mine.status = mpi::Status::failed;
    mine.device = static_cast<std::int32_t>(kind);
    text = std::move(message);
  }
  mine.signature = signature;
  mine.message_bytes = text.size();
  Round round;
  round.headers = mpi::exchange_headers(mine, where);
  round.messages = mpi::exchange_messages(round.headers, text);
  return round;
}

/// The first process's failure, raised on every process alike (its own exception there).
void raise_first_failure(const Round& round, const std::exception_ptr& mine, int rank,
                         const std::string& name) {
  for (std::size_t p = 0; p < round.headers.size(); ++p) {
    if (round.headers[p].status == mpi::Status::ok) continue;
    if (static_cast<int>(p) == rank) std::rethrow_exception(mine);
    const std::string& text = round.messages[p];
    switch (static_cast<ErrorKind>(round.headers[p].device)) {
      case ErrorKind::value: throw ValueError(text);
      case ErrorKind::type: throw TypeError(text);
      case ErrorKind::name: throw NameError(text);
      case ErrorKind::other: break;
    }
    throw ValueError(fmt::format("{}: process {} failed: {}", name, p, text));
  }
}

std::string axis_list(const Partition& part, int d, const MeshShape& mesh) {
  std::vector<std::string> names;
  for (int j = 0; j < part.count[static_cast<std::size_t>(d)]; ++j)
    names.push_back(fmt::format("'{}'", *mesh.names[static_cast<std::size_t>(
                                             part.axes[static_cast<std::size_t>(d)][static_cast<std::size_t>(j)])]));
  return fmt::format("({})", fmt::join(names, ", "));
}

std::string spec_name(int spec) { return fmt::format("in_specs[{}]", spec); }

/// The spec a leaf follows: its in_spec, or none (replicated) for a leaf of no spec.
const Partition& spec_of(const ProcessLeaf& leaf, std::span<const Partition> specs) {
  static const Partition none;
  return leaf.spec >= 0 ? specs[static_cast<std::size_t>(leaf.spec)] : none;
}

bool splits(const Partition& part, int d) {
  return d < part.rank && part.count[static_cast<std::size_t>(d)] > 0;
}

}  // namespace

ProcessSpan::ProcessSpan(const MeshShape& mesh, int processes, int local, int rank,
                         bool devices_in_order, std::string name)
    : mesh_(mesh), processes_(processes), local_(local), rank_(rank), in_order_(devices_in_order),
      name_(std::move(name)) {
  if (mesh_.size() != processes_ * local_) return;  // check() says so
  for (int p = 0; p < processes_; ++p) {
    ProcessBox box;
    std::array<int, kMaxMeshAxes> hi{};
    box.lo.fill(INT_MAX);
    for (int i = p * local_; i < (p + 1) * local_; ++i)
      for (int a = 0; a < mesh_.num_axes; ++a) {
        const auto u = static_cast<std::size_t>(a);
        box.lo[u] = std::min(box.lo[u], mesh_.coord(i, a));
        hi[u] = std::max(hi[u], mesh_.coord(i, a));
      }
    for (int a = 0; a < mesh_.num_axes; ++a)
      box.len[static_cast<std::size_t>(a)] = hi[static_cast<std::size_t>(a)] - box.lo[static_cast<std::size_t>(a)] + 1;
    boxes_.push_back(box);
  }
}

void ProcessSpan::check() const {
  const int global = processes_ * local_;
  if (mesh_.size() != global || !in_order_)
    raise_value_error(fmt::format(
        "{} across {} processes needs a Mesh of all {} devices of the runtime (every process's, "
        "in id order), but its mesh has {} devices{}; a Mesh on a process-local runtime maps "
        "that process's devices only",
        name_, processes_, global, mesh_.size(), in_order_ ? "" : " not in id order"));
  std::vector<std::string> shape;
  for (int a = 0; a < mesh_.num_axes; ++a)
    shape.push_back(fmt::format("'{}': {}", *mesh_.names[static_cast<std::size_t>(a)],
                                mesh_.sizes[static_cast<std::size_t>(a)]));
  for (int p = 0; p < processes_; ++p) {
    int n = 1;
    for (int a = 0; a < mesh_.num_axes; ++a) n *= boxes_[static_cast<std::size_t>(p)].len[static_cast<std::size_t>(a)];
    if (n != local_)
      raise_value_error(fmt::format(
          "{}: the devices of process {} (mesh positions {} to {}) do not form a block of the "
          "mesh {{{}}}; each process's devices must be a box of the mesh, as when its leading "
          "axes are the processes' (Mesh({{{{\"proc\", {}}}, {{\"x\", {}}}}}))",
          name_, p, p * local_, (p + 1) * local_ - 1, fmt::join(shape, ", "), processes_, local_));
  }
}

MeshShape ProcessSpan::local_mesh() const {
  MeshShape local = mesh_;
  for (int a = 0; a < mesh_.num_axes; ++a)
    local.sizes[static_cast<std::size_t>(a)] = boxes_[static_cast<std::size_t>(rank_)].len[static_cast<std::size_t>(a)];
  return local;
}

bool ProcessSpan::replicated(const Partition& p) const {
  for (int a = 0; a < mesh_.num_axes; ++a) {
    const auto u = static_cast<std::size_t>(a);
    if (boxes_[static_cast<std::size_t>(rank_)].len[u] < mesh_.sizes[u] && !p.names(a)) return true;
  }
  return false;
}

bool ProcessSpan::same_blocks(const Partition& part, int p, int q) const {
  for (int a = 0; a < mesh_.num_axes; ++a)
    if (part.names(a) && boxes_[static_cast<std::size_t>(p)].lo[static_cast<std::size_t>(a)] !=
                             boxes_[static_cast<std::size_t>(q)].lo[static_cast<std::size_t>(a)])
      return false;
  return true;
}

std::pair<int, int> ProcessSpan::blocks_of(const Partition& part, int d, int p) const {
  int first = 0, count = 1;
  const ProcessBox& box = boxes_[static_cast<std::size_t>(p)];
  for (int j = 0; j < part.count[static_cast<std::size_t>(d)]; ++j) {
    const auto a = static_cast<std::size_t>(part.axes[static_cast<std::size_t>(d)][static_cast<std::size_t>(j)]);
    first = first * mesh_.sizes[a] + box.lo[a];
    count *= box.len[a];
  }
  return {first, count};
}

Block ProcessSpan::block(const Partition& part, const Shape& global) const {
  Block b{global, {}, global};
  for (int d = 0; d < part.rank && d < global.rank; ++d) {
    const auto u = static_cast<std::size_t>(d);
    if (part.count[u] == 0) continue;
    const auto [first, count] = blocks_of(part, d, rank_);
    const std::int64_t s = global.dims[u], k = part.blocks(d, mesh_);
    const Range lo = block_range(s, k, first), hi = block_range(s, k, first + count - 1);
    b.start[u] = lo.start;
    b.extent.dims[u] = hi.start + hi.extent - lo.start;
  }
  return b;
}

void ProcessSpan::check_contiguous(const Partition& p, const std::string& spec,
                                   const std::string& what) const {
  const ProcessBox& box = boxes_[static_cast<std::size_t>(rank_)];  // every process's has these lengths
  for (int d = 0; d < p.rank; ++d) {
    bool spread = false;  // an earlier axis of the entry spans several of the process's devices
    for (int j = 0; j < p.count[static_cast<std::size_t>(d)]; ++j) {
      const auto a = static_cast<std::size_t>(p.axes[static_cast<std::size_t>(d)][static_cast<std::size_t>(j)]);
      if (spread && box.len[a] != mesh_.sizes[a])
        raise_value_error(fmt::format(
            "{}: {} splits dimension {} of {} over mesh axes {}, but then the devices of each "
            "process hold blocks of that dimension that are not contiguous, so no process "
            "block can be passed; list the mesh axes that span processes first in that entry",
            name_, spec, d, what, axis_list(p, d, mesh_)));
      if (box.len[a] > 1) spread = true;
    }
  }
}

void ProcessSpan::agree_on_arguments(std::exception_ptr error, const std::vector<ProcessLeaf>& leaves,
                                     std::span<const Partition> specs) const {
  // What must be the same everywhere: the mesh, the specs, the leaves' paths and types.
  std::uint64_t signature = hash_mix(kHashSeed, static_cast<std::uint64_t>(mesh_.num_axes));
  for (int a = 0; a < mesh_.num_axes; ++a) {
    const std::string& axis = *mesh_.names[static_cast<std::size_t>(a)];
    signature = hash_mix(hash_bytes(signature, axis.data(), axis.size()),
                         static_cast<std::uint64_t>(mesh_.sizes[static_cast<std::size_t>(a)]));
  }
  for (const Partition& part : specs) signature = hash_bytes(signature, &part, sizeof part);
  std::string description, records;
  for (const ProcessLeaf& leaf : leaves) {
    signature = hash_bytes(signature, leaf.path.data(), leaf.path.size());
    signature = hash_bytes(signature, leaf.dtype, std::strlen(leaf.dtype));
    signature = hash_mix(hash_mix(hash_mix(signature, static_cast<std::uint64_t>(leaf.layout)),
                                  static_cast<std::uint64_t>(leaf.spec + 1)),
                         static_cast<std::uint64_t>(leaf.shape.rank));
    description += fmt::format("{}{} {}", description.empty() ? "" : ", ", leaf.path,
                               format_typed_shape(leaf.dtype, leaf.shape));
    put_shape(records, leaf.shape);
    put(records, leaf.hash);
  }
  std::string payload;
  put(payload, static_cast<std::uint64_t>(description.size()));
  payload += description;
  payload += records;
  const Round round = exchange(error, signature, payload, "the start of a call");
  raise_first_failure(round, error, rank_, name_);
  std::vector<std::vector<ProcessLeaf>> all(static_cast<std::size_t>(processes_), leaves);
  std::vector<std::string> passed;
  bool differ = false;
  for (int p = 0; p < processes_; ++p) {
    Reader in(round.messages[static_cast<std::size_t>(p)]);
    passed.push_back(fmt::format("process {} passed {}", p, in.text(in.get<std::uint64_t>())));
    differ = differ || round.headers[static_cast<std::size_t>(p)].signature != signature;
    for (ProcessLeaf& leaf : all[static_cast<std::size_t>(p)]) {
      leaf.shape = get_shape(in);
      leaf.hash = in.get<std::uint64_t>();
    }
  }
  if (differ)
    raise_value_error(fmt::format(
        "{} got different arguments on different processes; every process must call it over "
        "the same mesh and specs, with arguments of the same structure, types and ranks: {}",
        name_, fmt::join(passed, "; ")));
  check_leaf_sizes(all, specs);
  check_leaf_bits(all, specs);
}

void ProcessSpan::check_leaf_sizes(const std::vector<std::vector<ProcessLeaf>>& all,
                                   std::span<const Partition> specs) const {
  const std::vector<ProcessLeaf>& first = all[0];
  for (std::size_t l = 0; l < first.size(); ++l) {
    const ProcessLeaf& leaf = first[l];
    const Partition& part = spec_of(leaf, specs);
    for (int d = 0; d < leaf.shape.rank; ++d) {
      const auto u = static_cast<std::size_t>(d);
      auto size = [&](int p) { return all[static_cast<std::size_t>(p)][l].shape.dims[u]; };
      if (!splits(part, d)) {
        for (int p = 1; p < processes_; ++p)
          if (size(p) != size(0))
            raise_value_error(fmt::format(
                "{}: process {} passed {} with size {} along dimension {}, but process 0 passed "
                "size {}; {} does not split that dimension, so every process passes it whole",
                name_, p, leaf.path, size(p), d, size(0), spec_name(leaf.spec)));
        continue;
      }
      // The global size: each distinct process block once, in block order.
      const int k = part.blocks(d, mesh_);
      std::vector<std::int64_t> block_size(static_cast<std::size_t>(k), -1);
      std::vector<std::string> sizes;
      std::int64_t global = 0;
      for (int p = 0; p < processes_; ++p) {
        sizes.push_back(std::to_string(size(p)));
        std::int64_t& b = block_size[static_cast<std::size_t>(blocks_of(part, d, p).first)];
        if (b < 0) b = size(p), global += b;
      }
      for (int p = 0; p < processes_; ++p) {
        const auto [b0, c] = blocks_of(part, d, p);
        const Range lo = block_range(global, k, b0), hi = block_range(global, k, b0 + c - 1);
        const std::int64_t expected = hi.start + hi.extent - lo.start;
        if (size(p) != expected)
          raise_value_error(fmt::format(
              "{}: process {} passed {} with size {} along dimension {}, but {} was expected: {} "
              "splits that dimension into {} blocks, process {} holds blocks {} to {}, and the "
              "process blocks (sizes [{}] on processes 0 to {}) make a global size of {}",
              name_, p, leaf.path, size(p), d, expected, spec_name(leaf.spec), k, p, b0,
              b0 + c - 1, fmt::join(sizes, ", "), processes_ - 1, global));
      }
    }
  }
}

void ProcessSpan::check_leaf_bits(const std::vector<std::vector<ProcessLeaf>>& all,
                                  std::span<const Partition> specs) const {
  const std::vector<ProcessLeaf>& first = all[0];
  for (std::size_t l = 0; l < first.size(); ++l) {
    const ProcessLeaf& leaf = first[l];
    const Partition& part = spec_of(leaf, specs);
    for (int q = 1; q < processes_; ++q)
      for (int p = 0; p < q; ++p) {
        if (!same_blocks(part, p, q)) continue;
        if (all[static_cast<std::size_t>(p)][l].hash != all[static_cast<std::size_t>(q)][l].hash)
          raise_value_error(fmt::format(
              "{}: {} differs between processes {} and {}, which hold the same block of it ({}); "
              "pass the same values on both, or split it over the mesh axes that span processes",
              name_, leaf.path, p, q,
              leaf.spec >= 0 ? spec_name(leaf.spec) + " splits it over no axis that tells them apart"
                             : "a non-tensor argument is broadcast to every device"));
        break;  // q is compared with the first process of its replicas
      }
  }
}

void ProcessSpan::agree_on_outputs(std::exception_ptr error,
                                   const std::vector<OutputDigest>& outputs) const {
  std::string payload;
  for (const OutputDigest& out : outputs) {
    put_shape(payload, out.shape);
    put(payload, static_cast<std::uint64_t>(out.hashes.size()));
    for (std::uint64_t h : out.hashes) put(payload, h);
  }
  const Round round = exchange(error, outputs.size(), payload, "the outputs of a call");
  raise_first_failure(round, error, rank_, name_);
  for (int p = 0; p < processes_; ++p)
    if (round.headers[static_cast<std::size_t>(p)].signature != outputs.size())
      raise_value_error(fmt::format("{} returned {} outputs on process {} but {} on process {}; "
                                    "every device must return as many outputs",
                                    name_, round.headers[static_cast<std::size_t>(p)].signature, p,
                                    outputs.size(), rank_));
  std::vector<std::vector<OutputDigest>> all(static_cast<std::size_t>(processes_), outputs);
  for (int p = 0; p < processes_; ++p) {
    Reader in(round.messages[static_cast<std::size_t>(p)]);
    for (OutputDigest& out : all[static_cast<std::size_t>(p)]) {
      out.shape = get_shape(in);
      out.hashes.assign(in.get<std::uint64_t>(), 0);
      for (std::uint64_t& h : out.hashes) h = in.get<std::uint64_t>();
    }
  }
  for (std::size_t k = 0; k < outputs.size(); ++k) check_output(all, k);
}

void ProcessSpan::check_output(const std::vector<std::vector<OutputDigest>>& all, std::size_t k) const {
  const OutputDigest& mine = all[static_cast<std::size_t>(rank_)][k];
  const Partition& part = mine.partition;
  auto at = [&](int p) -> const OutputDigest& { return all[static_cast<std::size_t>(p)][k]; };
  // Along each dimension, processes that hold the same blocks of it hold blocks of one size.
  for (int q = 1; q < processes_; ++q)
    for (int d = 0; d < mine.shape.rank; ++d)
      for (int p = 0; p < q; ++p) {
        if (splits(part, d) && blocks_of(part, d, p).first != blocks_of(part, d, q).first) continue;
        if (at(p).shape.dims[static_cast<std::size_t>(d)] != at(q).shape.dims[static_cast<std::size_t>(d)])
          raise_value_error(fmt::format(
              "{} output {} has a process block of shape {} on process {} but of shape {} on "
              "process {}, which hold the same blocks of it along dimension {}; blocks may "
              "differ only along the dimensions out_specs[{}] splits",
              name_, mine.index, format_shape(at(q).shape), q, format_shape(at(p).shape), p, d,
              mine.index));
        break;
      }
  // Processes that hold the same block of it returned the same bits (hashes were sent).
  for (int q = 1; q < processes_; ++q)
    for (int p = 0; p < q; ++p) {
      if (!same_blocks(part, p, q)) continue;
      const std::vector<std::uint64_t>& a = at(p).hashes;
      const std::vector<std::uint64_t>& b = at(q).hashes;
      for (std::size_t m = 0; m < std::min(a.size(), b.size()); ++m) {
        if (a[m] == b[m]) continue;
        int axis = 0;  // the first mesh axis it omits along which p and q lie apart
        for (int x = 0; x < mesh_.num_axes; ++x)
          if (!part.names(x) && boxes_[static_cast<std::size_t>(p)].lo[static_cast<std::size_t>(x)] !=
                                    boxes_[static_cast<std::size_t>(q)].lo[static_cast<std::size_t>(x)]) {
            axis = x;
            break;
          }
        raise_not_replicated_along(name_, mine.index, *mesh_.names[static_cast<std::size_t>(axis)],
                                   q * local_ + mine.devices[m], p * local_ + mine.devices[m]);
      }
      break;
    }
}

}  // namespace pmap::detail
