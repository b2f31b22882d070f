#include "core/serving/step_sync.h"

#include <ATen/ATen.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace lgpt {
namespace {

class Writer {
 public:
  void Int(int64_t v) { Raw(&v, sizeof(v)); }
  void Bytes(const std::string& s) {
    Int(static_cast<int64_t>(s.size()));
    Raw(s.data(), s.size());
  }
  void Ints(const std::vector<int64_t>& v) {
    Int(static_cast<int64_t>(v.size()));
    Raw(v.data(), v.size() * sizeof(int64_t));
  }
  std::string Take() { return std::move(out_); }

 private:
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  absl::StatusOr<int64_t> Int() {
    int64_t v = 0;
    RETURN_IF_ERROR(Raw(&v, sizeof(v)));
    return v;
  }
  absl::StatusOr<int64_t> Count(size_t element) {
    ASSIGN_OR_RETURN(const int64_t n, Int());
    if (n < 0 || static_cast<uint64_t>(n) > (in_.size() - at_) / element) {
      return absl::InvalidArgumentError(absl::StrCat("step message: a count of ", n, " at byte ",
                                                     at_, " runs past its ", in_.size(), " bytes"));
    }
    return n;
  }
  absl::StatusOr<std::string> Bytes() {
    ASSIGN_OR_RETURN(const int64_t n, Count(1));
    std::string s(static_cast<size_t>(n), '\0');
    RETURN_IF_ERROR(Raw(s.data(), s.size()));
    return s;
  }
  absl::StatusOr<std::vector<int64_t>> Ints() {
    ASSIGN_OR_RETURN(const int64_t n, Count(sizeof(int64_t)));
    std::vector<int64_t> v(static_cast<size_t>(n));
    RETURN_IF_ERROR(Raw(v.data(), v.size() * sizeof(int64_t)));
    return v;
  }
  absl::Status End() const {
    if (at_ == in_.size()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("step message: ", in_.size() - at_, " bytes left over"));
  }

 private:
  absl::Status Raw(void* p, size_t n) {
    if (n > in_.size() - at_) {
      return absl::InvalidArgumentError(
          absl::StrCat("step message: truncated at byte ", at_, " of ", in_.size()));
    }
    std::memcpy(p, in_.data() + at_, n);
    at_ += n;
    return absl::OkStatus();
  }
  const std::string& in_;
  size_t at_ = 0;
};

std::vector<int64_t> AsInts(const std::vector<uint64_t>& v) {
  return std::vector<int64_t>(v.begin(), v.end());
}

class GroupStepSync : public StepSync {
 public:
  explicit GroupStepSync(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {}

  bool leader() const override { return group_->rank() == 0; }

  absl::Status SharePlan(StepPlan& plan) override {
    std::string bytes = leader() ? EncodeStepPlan(plan) : std::string();
    RETURN_IF_ERROR(Share(bytes));
    if (leader()) return absl::OkStatus();
    ASSIGN_OR_RETURN(plan, DecodeStepPlan(bytes));
    return absl::OkStatus();
  }

  absl::Status ShareTokens(StepTokens& tokens) override {
    std::string bytes = leader() ? EncodeStepTokens(tokens) : std::string();
    RETURN_IF_ERROR(Share(bytes));
    if (leader()) return absl::OkStatus();
    ASSIGN_OR_RETURN(tokens, DecodeStepTokens(bytes));
    return absl::OkStatus();
  }

 private:
  // Rank 0's bytes to every rank: their length, then (when there are any) the bytes.
  absl::Status Share(std::string& bytes) {
    at::Tensor length = at::tensor({static_cast<int64_t>(bytes.size())}, at::kLong);
    RETURN_IF_ERROR(group_->Broadcast(length, 0));
    const int64_t n = length.item<int64_t>();
    if (n == 0) return absl::OkStatus();
    at::Tensor payload = at::empty({n}, at::kByte);
    if (leader()) std::memcpy(payload.data_ptr<uint8_t>(), bytes.data(), bytes.size());
    RETURN_IF_ERROR(group_->Broadcast(payload, 0));
    if (!leader()) bytes.assign(reinterpret_cast<const char*>(payload.data_ptr<uint8_t>()), n);
    return absl::OkStatus();
  }

  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace

std::string EncodeStepPlan(const StepPlan& plan) {
  Writer w;
  w.Int(plan.stop ? 1 : 0);
  w.Ints(AsInts(plan.cancelled));
  w.Int(static_cast<int64_t>(plan.arrivals.size()));
  for (const ReplicaRequest& r : plan.arrivals) {
    w.Int(static_cast<int64_t>(r.id));
    w.Int(r.group);
    w.Ints(r.prompt);
    w.Int(r.max_new_tokens);
    w.Int(r.prefill_chunk);
    w.Int(r.start_position);
    w.Int(r.adapter);
    w.Bytes(r.cache_recipe);
  }
  w.Int(static_cast<int64_t>(plan.proposals.size()));
  for (const StepProposal& p : plan.proposals) {
    w.Int(static_cast<int64_t>(p.id));
    w.Ints(p.tokens);
  }
  return w.Take();
}

absl::StatusOr<StepPlan> DecodeStepPlan(const std::string& bytes) {
  Reader r(bytes);
  StepPlan plan;
  ASSIGN_OR_RETURN(const int64_t stop, r.Int());
  plan.stop = stop != 0;
  ASSIGN_OR_RETURN(const std::vector<int64_t> cancelled, r.Ints());
  plan.cancelled.assign(cancelled.begin(), cancelled.end());
  ASSIGN_OR_RETURN(const int64_t arrivals, r.Count(8 * sizeof(int64_t)));
  for (int64_t i = 0; i < arrivals; ++i) {
    ReplicaRequest a;
    ASSIGN_OR_RETURN(const int64_t id, r.Int());
    a.id = static_cast<uint64_t>(id);
    ASSIGN_OR_RETURN(a.group, r.Int());
    ASSIGN_OR_RETURN(a.prompt, r.Ints());
    ASSIGN_OR_RETURN(a.max_new_tokens, r.Int());
    ASSIGN_OR_RETURN(a.prefill_chunk, r.Int());
    ASSIGN_OR_RETURN(a.start_position, r.Int());
    ASSIGN_OR_RETURN(a.adapter, r.Int());
    ASSIGN_OR_RETURN(a.cache_recipe, r.Bytes());
    plan.arrivals.push_back(std::move(a));
  }
  ASSIGN_OR_RETURN(const int64_t proposals, r.Count(2 * sizeof(int64_t)));
  for (int64_t i = 0; i < proposals; ++i) {
    StepProposal p;
    ASSIGN_OR_RETURN(const int64_t id, r.Int());
    p.id = static_cast<uint64_t>(id);
    ASSIGN_OR_RETURN(p.tokens, r.Ints());
    plan.proposals.push_back(std::move(p));
  }
  RETURN_IF_ERROR(r.End());
  return plan;
}

std::string EncodeStepTokens(const StepTokens& tokens) {
  Writer w;
  w.Ints(AsInts(tokens.ids));
  w.Ints(tokens.tokens);
  w.Ints(tokens.counts.empty() ? std::vector<int64_t>(tokens.ids.size(), 1) : tokens.counts);
  w.Ints(std::vector<int64_t>(tokens.done.begin(), tokens.done.end()));
  return w.Take();
}

absl::StatusOr<StepTokens> DecodeStepTokens(const std::string& bytes) {
  Reader r(bytes);
  StepTokens out;
  ASSIGN_OR_RETURN(const std::vector<int64_t> ids, r.Ints());
  ASSIGN_OR_RETURN(out.tokens, r.Ints());
  ASSIGN_OR_RETURN(out.counts, r.Ints());
  ASSIGN_OR_RETURN(const std::vector<int64_t> done, r.Ints());
  RETURN_IF_ERROR(r.End());
  int64_t counted = 0;
  for (const int64_t count : out.counts) {
    if (count < 1) {
      return absl::InvalidArgumentError(absl::StrCat("step tokens: a count of ", count));
    }
    counted += count;
  }
  if (out.counts.size() != ids.size() || counted != static_cast<int64_t>(out.tokens.size()) ||
      done.size() != ids.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step tokens: ", ids.size(), " ids, ", out.counts.size(), " counts of ", counted,
        " tokens, ", out.tokens.size(), " tokens, ", done.size(), " end flags"));
  }
  out.ids.assign(ids.begin(), ids.end());
  out.done.assign(done.begin(), done.end());
  return out;
}

std::shared_ptr<StepSync> ProcessGroupStepSync(std::shared_ptr<ProcessGroup> group) {
  return std::make_shared<GroupStepSync>(std::move(group));
}

}  // namespace lgpt
