/// @file process_blocks.hpp
/// @brief shard_map across processes (SPEC 13): the block of the global mesh that each
/// process's devices form, the agreement on global shapes before a call, and on the outputs
/// that processes replicate after it. No MPI types here (distributed.hpp carries them).
#pragma once

#include <array>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "pmap/detail/blocks.hpp"
#include "pmap/detail/shape.hpp"

namespace pmap::detail {

/// Process p's devices as a box of the global mesh: coordinates [lo, lo + len) along each
/// axis (a process's devices are consecutive in the mesh's row-major order).
struct ProcessBox {
  std::array<int, kMaxMeshAxes> lo{}, len{};
};

/// One leaf of a call's arguments as this process passes it.
struct ProcessLeaf {
  std::string path;          ///< "args[0][1]", for messages
  const char* dtype = "";    ///< "float32"
  int layout = 0;            ///< Eigen::RowMajor or ColMajor (0)
  int spec = -1;             ///< the in_specs entry that splits it; -1: broadcast whole
  Shape shape;               ///< its process block's shape
  std::uint64_t hash = 0;    ///< of its bytes, when processes replicate it and it is checked
};

/// What a process's devices returned for one output: its process block's shape and, when
/// other processes hold the same block, a hash of every distinct device block in mesh order.
struct OutputDigest {
  int index = 0;                      ///< output k
  Partition partition;                ///< out_specs[k]
  Shape shape;
  std::vector<int> devices;           ///< the devices (local) whose blocks are hashed
  std::vector<std::uint64_t> hashes;  ///< their blocks' hashes
};

/// A shard_map call whose mesh spans every process's devices: P processes of L devices each,
/// process p's at mesh positions [p * L, p * L + L).
class ProcessSpan {
 public:
  /// `mesh` over the devices of `processes` processes of `local` devices; check() says
  /// whether it can run there.
  ProcessSpan(const MeshShape& mesh, int processes, int local, int rank, bool devices_in_order,
              std::string name);
  /// ValueError unless the mesh has every device of the runtime in id order and each
  /// process's devices form a box of it.
  void check() const;

  int processes() const { return processes_; }
  int local() const { return local_; }
  /// Mesh position of this process's first device.
  int base() const { return rank_ * local_; }
  /// This process's devices as a mesh of their own: the global axes' names, the box's sizes.
  MeshShape local_mesh() const;
  /// Whether another process holds the same block of a tensor split by `p` (a mesh axis that
  /// spans processes is not named by it).
  bool replicated(const Partition& p) const;
  /// ValueError unless every process's devices hold a contiguous range of blocks along every
  /// dimension `p` splits; `spec` is "in_specs[0]", `what` "args[1]" or "output 0".
  void check_contiguous(const Partition& p, const std::string& spec, const std::string& what) const;
  /// Where this process's block of a tensor of shape `global` split by `p` lies in it.
  Block block(const Partition& p, const Shape& global) const;

  /// Before any kernel runs: every process learns every other's verdict (`error`, or the
  /// leaves it passes), the mesh, the specs and the leaves' structure and types must be the
  /// same everywhere, each process block's size must be the one SPEC 9's rule gives it of the
  /// global size, and replicated leaves must be equal (their hashes). The same error on every
  /// process. `specs`: the in_specs' partitions.
  void agree_on_arguments(std::exception_ptr error, const std::vector<ProcessLeaf>& leaves,
                          std::span<const Partition> specs) const;

  /// After the devices finished (every process arrives here): `error` is this process's
  /// failure since (E14, the output pass); processes that hold the same block of an output
  /// must have the same shape and (hashes given) the same bits. Raises on every process alike.
  void agree_on_outputs(std::exception_ptr error, const std::vector<OutputDigest>& outputs) const;

 private:
  /// Process p's first block and block count along dimension d of `part`.
  std::pair<int, int> blocks_of(const Partition& part, int d, int p) const;
  /// Whether processes p and q hold the same blocks of a tensor split by `part`.
  bool same_blocks(const Partition& part, int p, int q) const;
  void check_leaf_sizes(const std::vector<std::vector<ProcessLeaf>>& all,
                        std::span<const Partition> specs) const;
  void check_leaf_bits(const std::vector<std::vector<ProcessLeaf>>& all,
                       std::span<const Partition> specs) const;
  void check_output(const std::vector<std::vector<OutputDigest>>& all, std::size_t k) const;

  MeshShape mesh_;
  std::vector<ProcessBox> boxes_;
  int processes_, local_, rank_;
  bool in_order_;
  std::string name_;
};

}  // namespace pmap::detail
