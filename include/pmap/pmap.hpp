/// @file pmap.hpp
/// @brief The umbrella header of pmap: JAX's pmap for CPUs, over Eigen tensors and oneTBB.
///
/// @code
///   #include <pmap/pmap.hpp>
///   auto f = pmap::pmap([](pmap::Context& ctx, auto x) { return pmap::eval(x / ctx.psum(x, "i")); },
///                       {.axis_name = "i"});
///   Eigen::Tensor<float, 2, Eigen::RowMajor> xs(pmap::device_count(), 16);
///   xs.setRandom();
///   Eigen::Tensor<float, 2, Eigen::RowMajor> ys = f(xs);   // each column divided by its sum
/// @endcode
#pragma once

#include "pmap/axes.hpp"
#include "pmap/collectives.hpp"
#include "pmap/context.hpp"
#include "pmap/distributed.hpp"
#include "pmap/errors.hpp"
#include "pmap/eval.hpp"
#include "pmap/logging.hpp"
#include "pmap/mapped.hpp"
#include "pmap/mesh.hpp"
#include "pmap/options.hpp"
#include "pmap/pending.hpp"
#include "pmap/ragged.hpp"
#include "pmap/runtime.hpp"
#include "pmap/shard_map.hpp"
#include "pmap/trace.hpp"
