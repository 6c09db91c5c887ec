#include "engine/value_rules.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tileops::engine {
namespace {

// Slots built from host vectors: int32 offsets/lengths, a 2-D int32 table, shapes only.
struct Call {
  std::vector<std::vector<int32_t>> data;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::string> names;

  int add(std::string name, std::vector<int32_t> values, std::vector<int64_t> shape) {
    data.push_back(std::move(values));
    shapes.push_back(std::move(shape));
    names.push_back(std::move(name));
    return static_cast<int>(data.size()) - 1;
  }
  std::vector<SlotValues> slots() const {
    std::vector<SlotValues> out(data.size());
    for (size_t i = 0; i < data.size(); ++i) {
      out[i].present = true;
      out[i].data = data[i].data();
      out[i].bits = 32;
      out[i].is_int = true;
      out[i].shape = shapes[i];
    }
    return out;
  }
  std::string check(const std::vector<ValueRule>& rules) const {
    const auto s = slots();
    return check_value_rules(rules, s, names);
  }
};

std::vector<int64_t> constant(int64_t v) { return {static_cast<int64_t>(Op::kConst), v}; }
std::vector<int64_t> dim(int slot, int64_t axis) { return {static_cast<int64_t>(Op::kDim), slot, axis}; }

TEST(ValueRules, OffsetsMustStartAtZeroNeverDecreaseAndEndAtTheTotal) {
  Call call;
  const int q = call.add("q", {}, {6, 2});
  const int cu = call.add("cu", {0, 2, 2, 6}, {4});
  const std::vector<ValueRule> rules{{ValueKind::kOffsets, "offsets(cu, q.shape[0])", {cu}, {dim(q, 0)}}};
  EXPECT_EQ(call.check(rules), "");
  call.data[cu] = {0, 3, 2, 6};
  EXPECT_EQ(call.check(rules),
            "value rule `offsets(cu, q.shape[0])` does not hold: cu[2] = 2 is less than cu[1] = 3: offsets must not "
            "decrease");
  call.data[cu] = {1, 2, 3, 6};
  EXPECT_NE(call.check(rules).find("cu[0] = 1, expected 0"), std::string::npos);
  call.data[cu] = {0, 2, 3, 5};
  EXPECT_NE(call.check(rules).find("cu[3] = 5, expected 6"), std::string::npos);
  const std::vector<ValueRule> within{{ValueKind::kOffsetsWithin, "offsets_within(cu, 6)", {cu}, {constant(6)}}};
  EXPECT_EQ(call.check(within), "");  // trailing rows are padding
}

TEST(ValueRules, ScalarsAreComputedFromShapesAndConstants) {
  Call call;
  const int k = call.add("k", {}, {64, 2, 8});
  const int lens = call.add("lens", {16, 17}, {2});
  const int table = call.add("table", {0, 3, 1, 2}, {2, 2});
  // pages(table, 8, k.shape[0] // 8 - 4, lens): four pages, each sequence two of them
  std::vector<int64_t> pages = dim(k, 0);
  pages.insert(pages.end(), {static_cast<int64_t>(Op::kConst), 8, static_cast<int64_t>(Op::kFloorDiv),
                             static_cast<int64_t>(Op::kConst), 4, static_cast<int64_t>(Op::kSub)});
  const std::vector<ValueRule> rules{{ValueKind::kPages, "pages(...)", {table, lens}, {constant(8), pages}}};
  EXPECT_NE(call.check(rules).find("sequence 1 needs 17 tokens (lens[1]), more than its 2 pages of 8 hold (16)"),
            std::string::npos);
  call.data[lens] = {16, 9};
  EXPECT_EQ(call.check(rules), "");
  call.data[table] = {0, 4, 1, 2};
  EXPECT_NE(call.check(rules).find("table[0, 1] = 4 points outside the cache's 4 pages"), std::string::npos);
  call.data[table] = {0, 3, 1, -7};  // the unused second page of sequence 1... is used (9 > 8)
  EXPECT_NE(call.check(rules).find("table[1, 1] = -7"), std::string::npos);
  call.data[lens] = {16, 8};  // now it is not: an entry never read may hold anything
  EXPECT_EQ(call.check(rules), "");
}

TEST(ValueRules, PagesAddOffsetSpansToLengths) {
  Call call;
  const int cached = call.add("cache", {3, 0}, {2});
  const int cu = call.add("cu", {0, 2, 6}, {3});
  const int table = call.add("table", {1, 0}, {2, 1});
  const std::vector<ValueRule> rules{{ValueKind::kPages, "pages", {table, cached, cu}, {constant(4), constant(2)}}};
  EXPECT_NE(call.check(rules).find("sequence 0 needs 5 tokens (cache[0] + cu[1] - cu[0])"), std::string::npos);
  call.data[cached] = {2, 0};
  EXPECT_EQ(call.check(rules), "");
}

TEST(ValueRules, WritesApartRefusesARowWrittenTwiceOrReadWhileAnotherTokenWritesIt) {
  // four pages of 2 rows; each request appends its chunk after its cached tokens
  Call call;
  const int cached = call.add("cache", {2, 2}, {2});
  const int cu = call.add("cu", {0, 2, 3}, {3});
  const int table = call.add("table", {0, 1, 0, 3}, {2, 2});
  const std::vector<ValueRule> rules{
      {ValueKind::kWritesApart, "writes_apart", {table, cached, cu}, {constant(2), constant(4)}}};
  // both requests read page 0 (a shared prefix) and append to pages of their own
  EXPECT_EQ(call.check(rules), "");
  call.data[table] = {0, 1, 0, 1};
  EXPECT_NE(call.check(rules).find("request 1's position 2 (table[1, 1] = 1) writes cache row 2, which request 0's "
                                   "position 2 (table[0, 1] = 1) writes too"),
            std::string::npos);
  call.data[cached] = {0, 2};  // request 0 appends into page 0, which request 1 reads
  call.data[table] = {0, 1, 0, 3};
  EXPECT_NE(call.check(rules).find("request 1's position 0 (table[1, 0] = 0) reads cached row 0, which request 0's "
                                   "position 0 (table[0, 0] = 0) overwrites in this call"),
            std::string::npos);
  call.data[cached] = {0, 0};  // one request putting two of its positions in one row
  call.data[cu] = {0, 3, 3};
  call.data[table] = {1, 1, 2, 3};
  EXPECT_NE(call.check(rules).find("request 0's position 2 (table[0, 1] = 1) writes cache row 2, which request 0's "
                                   "position 0 (table[0, 0] = 1) writes too"),
            std::string::npos);
  call.data[table] = {1, 9, 2, 3};  // a page outside the cache is pages()'s to refuse
  EXPECT_EQ(call.check(rules), "");
}

TEST(ValueRules, SpansAndLowerBounds) {
  Call call;
  const int cu = call.add("cu", {0, 5, 6}, {3});
  const int lens = call.add("lens", {0, -1}, {2});
  EXPECT_NE(call.check({{ValueKind::kSpansAtMost, "spans", {cu}, {constant(4)}}}).find("cu[1] - cu[0] = 5 exceeds 4"),
            std::string::npos);
  EXPECT_NE(call.check({{ValueKind::kAtLeast, "low", {lens}, {constant(0)}}}).find("lens[1] = -1 is below 0"),
            std::string::npos);
}

TEST(ValueRules, WithinBoundsBothEnds) {
  Call call;
  const int pos = call.add("pos", {0, 7, 8}, {3});
  EXPECT_NE(
      call.check({{ValueKind::kWithin, "in", {pos}, {constant(0), constant(8)}}}).find("pos[2] = 8 is outside [0, 8)"),
      std::string::npos);
  EXPECT_NE(
      call.check({{ValueKind::kWithin, "in", {pos}, {constant(1), constant(9)}}}).find("pos[0] = 0 is outside [1, 9)"),
      std::string::npos);
  EXPECT_EQ(call.check({{ValueKind::kWithin, "in", {pos}, {constant(0), constant(9)}}}), "");
}

TEST(ValueRules, AnAbsentInputSkipsItsRuleAndAMissingAxisIsReported) {
  Call call;
  const int cu = call.add("cu", {0, 1}, {2});
  auto slots = call.slots();
  slots[0].present = false;
  EXPECT_EQ(
      check_value_rules(std::vector<ValueRule>{{ValueKind::kOffsets, "r", {cu}, {constant(1)}}}, slots, call.names),
      "");
  EXPECT_NE(call.check({{ValueKind::kOffsets, "r", {cu}, {dim(cu, 3)}}}).find("has no axis 3"), std::string::npos);
}

}  // namespace
}  // namespace tileops::engine
