// The price of a European call option by Monte Carlo under geometric Brownian motion, the
// paths split over the devices of a one-axis mesh named "paths". Each device draws from its
// own random stream, seeded from the run's seed and its index along the axis
// (ctx.axis_index("paths")), so the streams are distinct and every run of the same seed on
// the same device count draws the same numbers. Each device sums the discounted payoff and
// its square over its paths, and one psum of that pair (a tree: one collective) gives every
// device the totals, hence the price and its standard error. shard_map's kernel takes no
// tensor at all: the contract is broadcast by const reference (in spec P()).
//
// Two checks:
//  * the same streams run serially, one after the other, must give each device's sums
//    exactly, and their sum in device order must equal the psum exactly: pmap's reductions
//    add in the order of the devices along the axis, bitwise, whatever the threads do
//    (README, "Reductions are reproducible");
//  * the price must lie within 4 standard errors of the Black-Scholes closed form (a false
//    alarm once in 16,000 seeds; with the default seed it is a fixed outcome).
//
//   pmap_monte_carlo [--size PATHS] [--seed S] [--devices D] [--threads T]
//
// Defaults: 10,000,000 paths, seed 42, D = 8 devices on T = 2 threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <tuple>

#include <pmap/pmap.hpp>

#include "common.hpp"

namespace {

using Tensor1 = Eigen::Tensor<double, 1, Eigen::RowMajor>;

/// A European call: the right to buy at `strike` at time `maturity` (years), on a stock at
/// `spot` today with log-normal returns of `volatility`, money at the riskless `rate`.
struct Call {
  double spot, strike, rate, volatility, maturity;
};

constexpr Call kCall{.spot = 100, .strike = 110, .rate = 0.05, .volatility = 0.2, .maturity = 1};

/// The Black-Scholes price of the call.
double black_scholes(const Call& c) {
  auto normal_cdf = [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); };
  const double vol_t = c.volatility * std::sqrt(c.maturity);
  const double d1 =
      (std::log(c.spot / c.strike) + (c.rate + 0.5 * c.volatility * c.volatility) * c.maturity) /
      vol_t;
  const double d2 = d1 - vol_t;
  return c.spot * normal_cdf(d1) - c.strike * std::exp(-c.rate * c.maturity) * normal_cdf(d2);
}

/// The number of paths of device i of d, of n in all: shard_map's block rule (n / d, one more
/// for the first n % d devices), so the counts add up to n.
long paths_of(long n, int d, int i) { return n / d + (i < n % d ? 1 : 0); }

/// Device i's random stream. std::seed_seq spreads (seed, i) over the whole engine state, so
/// neighbouring indices give unrelated streams (seeding with seed + i would not).
std::mt19937_64 stream(std::uint64_t seed, int i) {
  std::seed_seq seq{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
                    static_cast<std::uint32_t>(i)};
  return std::mt19937_64(seq);
}

struct Sums {
  double payoff = 0;     ///< sum of the discounted payoffs
  double payoff_sq = 0;  ///< sum of their squares
};

/// `paths` terminal prices S_T = S exp((r - v^2 / 2) T + v sqrt(T) Z) drawn from gen, and the
/// sums of the discounted payoff exp(-r T) max(S_T - K, 0) and of its square. Kernel and
/// serial check share it, so both compute the same doubles from the same stream.
Sums simulate(const Call& c, std::mt19937_64& gen, long paths) {
  std::normal_distribution<double> normal(0.0, 1.0);
  const double drift = (c.rate - 0.5 * c.volatility * c.volatility) * c.maturity;
  const double vol_t = c.volatility * std::sqrt(c.maturity);
  const double discount = std::exp(-c.rate * c.maturity);
  Sums s;
  for (long p = 0; p < paths; ++p) {
    const double terminal = c.spot * std::exp(drift + vol_t * normal(gen));
    const double payoff = discount * std::max(terminal - c.strike, 0.0);
    s.payoff += payoff;
    s.payoff_sq += payoff * payoff;
  }
  return s;
}

struct Args {
  long size = 10'000'000;
  std::uint64_t seed = 42;
  int devices = 8;
  int threads = 2;
};

Args parse(int argc, char** argv) {
  examples::Flags flags(argc, argv, "[--size PATHS] [--seed S] [--devices D] [--threads T]");
  Args a;
  a.size = static_cast<long>(flags.integer("--size", a.size));
  a.seed = static_cast<std::uint64_t>(flags.integer("--seed", static_cast<long long>(a.seed)));
  a.devices = static_cast<int>(flags.integer("--devices", a.devices));
  a.threads = static_cast<int>(flags.integer("--threads", a.threads));
  flags.done();
  flags.require(a.size >= 2 && a.devices >= 1 && a.threads >= 1,
                "need --size of at least 2 paths, and positive --devices and --threads");
  return a;
}

/// The serial check: each device's stream run alone must give that device's sums (`mine`,
/// [2 D]: payoff, payoff^2 per device) exactly, and their sum in device order the psum's.
bool same_as_serial(const Args& args, const Tensor1& mine, double sum, double sum_sq) {
  Sums total;
  for (int i = 0; i < args.devices; ++i) {
    std::mt19937_64 gen = stream(args.seed, i);
    const Sums s = simulate(kCall, gen, paths_of(args.size, args.devices, i));
    if (s.payoff != mine(2 * i) || s.payoff_sq != mine(2 * i + 1)) {
      std::fprintf(stderr,
                   "monte_carlo: device %d's sums are %.17g and %.17g, its stream run serially "
                   "gives %.17g and %.17g\n",
                   i, mine(2 * i), mine(2 * i + 1), s.payoff, s.payoff_sq);
      return false;
    }
    total.payoff += s.payoff;
    total.payoff_sq += s.payoff_sq;
  }
  if (total.payoff != sum || total.payoff_sq != sum_sq) {
    std::fprintf(stderr,
                 "monte_carlo: the psum gives %.17g and %.17g, the serial sum in device order "
                 "%.17g and %.17g\n",
                 sum, sum_sq, total.payoff, total.payoff_sq);
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  pmap::Runtime rt({.num_devices = args.devices, .num_threads = args.threads});
  const pmap::Mesh mesh({{"paths", args.devices}}, &rt);

  // Each device: its stream, its paths, one psum of both sums over "paths" (replicated
  // outputs, P()), and its own sums as well (concatenated, P("paths")) for the serial check.
  auto price = pmap::shard_map(
      [n = args.size, seed = args.seed](pmap::Context& ctx, const Call& call) {
        const int i = ctx.axis_index("paths");
        std::mt19937_64 gen = stream(seed, i);
        const Sums s = simulate(call, gen, paths_of(n, ctx.axis_size("paths"), i));
        auto [sum, sum_sq] = ctx.psum(std::make_tuple(s.payoff, s.payoff_sq), "paths");
        Tensor1 mine(2);
        mine.setValues({s.payoff, s.payoff_sq});
        return std::make_tuple(sum, sum_sq, mine);
      },
      mesh, {pmap::P()}, {pmap::P(), pmap::P(), pmap::P("paths")});
  const auto [sum, sum_sq, mine] = price(kCall);

  if (!same_as_serial(args, mine, sum(), sum_sq())) return 1;
  const double n = static_cast<double>(args.size);
  const double mc = sum() / n;
  const double variance = (sum_sq() - n * mc * mc) / (n - 1);  // of one path's payoff
  const double std_error = std::sqrt(variance / n);
  const double bs = black_scholes(kCall);
  const double z = (mc - bs) / std_error;
  if (!(std::abs(z) < 4)) {
    std::fprintf(stderr,
                 "monte_carlo: the price %.6f is %.1f standard errors (%.6f) from "
                 "Black-Scholes' %.6f\n",
                 mc, z, std_error, bs);
    return 1;
  }
  std::printf(
      "monte_carlo: %ld paths on %d devices / %d threads: call price %.6f +- %.6f, "
      "Black-Scholes %.6f (%+.2f standard errors); sums equal to the streams run "
      "serially\n",
      args.size, args.devices, args.threads, mc, std_error, bs, z);
  return 0;
}
