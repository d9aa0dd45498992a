// SwiGLU routed-expert MLP computed on the CPU straight from host expert banks.
//
// Shape letters: T tokens, H hidden, I expert intermediate, N flat expert ids (l * E + e),
// P (token, expert, weight) triples.
//   out[t] = sum over triples (t, n, w) of  w * (down[n] @ act(g, u) + b_down[n])
//   g = gate[n] @ x[t] + b_gate[n],  u = up[n] @ x[t] + b_up[n]
// with gate[n] = gate_up[n, 0:I], up[n] = gate_up[n, I:2I] (transformers v5 fused layout) and
// act(g, u) = silu(g) * u (Qwen3 / OLMoE), or, with MoeProblem::swiglu_clamp, gpt-oss's
// (transformers GptOssExperts) act = (u' + 1) * g' * sigmoid(alpha * g'), g' = min(g, limit),
// u' = clamp(u, -limit, limit). The biases are optional (zero when absent).
// The banks may hold bf16, fp32, 4-bit (mxfp4, q4g, nvfp4) or fp8 weights (see WeightBank).
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include "freetoken/isa.h"
#include "freetoken/thread_pool.h"

namespace freetoken {

// One expert bank [N, R, C] (R output rows, C input columns) in any WeightFormat.
//   dense: values = [N, R, C] bf16 bits or fp32.
//   4-bit: values = [N, R, C / 2] packed codes; scales = [N, R, C / group] (uint8 E8M0 for mxfp4,
//          fp16 bits for q4g); zeros = [N, R, C / group] uint8 or nullptr (q4g only).
//   fp8:   values = [N, R, C] e4m3fn bytes; scales = [N, ceil(R / block_rows),
//          ceil(C / block_cols)] fp32.
//   nvfp4: values = [N, R, C / 2] packed e2m1 codes; scales = [N, R, C / 16] e4m3fn bytes;
//          row_scales = [N, R] fp32 (group = 16).
struct WeightBank {
  WeightFormat format = WeightFormat::kBf16;
  const void* values = nullptr;
  const void* scales = nullptr;
  const uint8_t* zeros = nullptr;
  int64_t group = 0;  // mxfp4 / q4g: C % group == 0, group % 32 == 0; nvfp4: 16
  int64_t block_rows = 0;  // fp8 only, >= 1
  int64_t block_cols = 0;  // fp8 only, >= 1
  const float* row_scales = nullptr;  // nvfp4 only
};

struct MoeProblem {
  const void* x = nullptr;   // [T, H], fp32 or bf16 bits (x_is_bf16)
  bool x_is_bf16 = false;
  int64_t num_tokens = 0;    // T
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I
  int64_t num_experts = 0;   // N
  WeightBank gate_up;                 // [N, 2I, H]
  WeightBank down;                    // [N, H, I]
  std::vector<int64_t> token_ids;     // [P], in [0, T)
  std::vector<int64_t> expert_ids;    // [P], in [0, N), or -1 to skip the triple
  std::vector<float> weights;         // [P] gate weights
  float* out = nullptr;               // [T, H] fp32, fully overwritten
  Isa isa = Isa::kScalar;
  // What x and silu(g) * u enter the matrices as (isa.h Activations): kFp32 as they are; kQ8 int8
  // per 32-column block, each block's dot product with the 4-bit weights an exact integer sum
  // (both banks mxfp4 or q4g, else moe_forward throws std::invalid_argument); kBf16 rounded to
  // bf16 values (round to nearest even) with fp32 sums. fp8 and nvfp4 banks take kFp32 only
  // (rows_kernel_for throws std::invalid_argument otherwise).
  Activations activations = Activations::kFp32;
  // gpt-oss experts (gate rows first, as above: a gpt-oss checkpoint's interleaved rows are
  // reordered at load). All added and clamped in fp32, whatever the activations; the defaults
  // (no biases, no clamp) compute silu(g) * u bit for bit as without these fields.
  const float* gate_up_bias = nullptr;  // [N, 2I] fp32: gate biases [0:I], up biases [I:2I]
  const float* down_bias = nullptr;     // [N, H] fp32, added before the gate weight
  bool swiglu_clamp = false;            // gpt-oss act (above) instead of silu(g) * u
  float swiglu_limit = 0.0f;            // > 0 (inf: no clamp) when swiglu_clamp
  float swiglu_alpha = 1.702f;
};

// Checks ids against T and N; throws std::invalid_argument with the offending position.
void validate_routing(const MoeProblem& p);

// Computes p.out on the pool; blocks until done. Results do not depend on the thread count.
// Throws std::invalid_argument for q8 activations with a dense bank, or for swiglu_clamp with
// a swiglu_limit that is not > 0 (NaN included).
void moe_forward(const MoeProblem& p, ThreadPool& pool);

// What submit() hands back: `done` becomes ready (or holds the exception) when the problem's out
// is written; *seconds is then the wall time (steady_clock) moe_forward ran on the pool, from the
// start of its compute to its end, and -1 before. *seconds is written before `done` is made ready,
// so reading it after waiting on `done` needs no further synchronisation.
struct MoeTicket {
  std::shared_future<void> done;
  std::shared_ptr<double> seconds;
  uint64_t id = 0;  // submission number within its runner
};

// Owns the thread pool and a dispatcher thread that runs submitted problems in order.
// A thread that waits for a problem which has not started, is next in line and finds the pool
// idle runs it itself (MoeRunner::wait), so a blocking call costs no thread hand-off.
class MoeRunner {
 public:
  explicit MoeRunner(int num_threads);
  ~MoeRunner();
  MoeRunner(const MoeRunner&) = delete;
  MoeRunner& operator=(const MoeRunner&) = delete;

  int num_threads() const { return pool_.size(); }

  // Queues p and returns at once (see MoeTicket). Every pointer in p must stay valid until the
  // ticket's future is ready.
  MoeTicket submit(MoeProblem p);

  // Queues any work that runs on the pool (e.g. linear_forward) in the same order as the MoE
  // problems, so the two never share the pool at once.
  MoeTicket submit_work(std::function<void(ThreadPool&)> work);

  // Blocks until t's problem is done (then t.done is ready; it holds any error). If the problem
  // has not started, is the next in submission order and no other problem is running, the
  // calling thread runs it on the pool instead of waking the dispatcher and sleeping.
  void wait(const MoeTicket& t);

 private:
  struct Job {
    std::function<void(ThreadPool&)> work;
    std::promise<void> done;
    std::shared_ptr<double> seconds;
    uint64_t id = 0;
  };

  void dispatch_loop();
  // Runs a job popped with busy_ set; clears busy_, then fulfils the job's promise.
  void run_job(std::unique_ptr<Job> job);

  ThreadPool pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Job>> queue_;
  uint64_t next_id_ = 0;
  bool busy_ = false;  // a job is running (on the dispatcher or on a waiting thread)
  bool stop_ = false;
  std::thread dispatcher_;
};

}  // namespace freetoken
