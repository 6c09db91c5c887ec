// The greedy pick (engine/greedy_pick.h): torch.argmax's first largest, on the floats' bits.
#include "engine/greedy_pick.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace tileops::engine {
namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

int64_t pick(const std::vector<float>& row) {
  std::vector<uint32_t> bits;
  for (float f : row) bits.push_back(bits_of(f));
  return first_largest(bits.data(), static_cast<int64_t>(bits.size()), LogitType::kFloat32);
}

TEST(GreedyPickTest, TheFirstOfTiedMaximaWinsAcrossBlocks) {
  std::vector<float> row(700, -1.0f);
  row[600] = row[300] = 9.0f;
  EXPECT_EQ(pick(row), 300);
}

TEST(GreedyPickTest, NegativeZeroAndPositiveZeroAreEqualSoTheFirstWins) {
  std::vector<float> row(600, -3.0f);
  row[450] = 0.0f;
  row[260] = -0.0f;
  EXPECT_EQ(pick(row), 260);
}

TEST(GreedyPickTest, NanIsLargestAndTheFirstNanWins) {
  std::vector<float> row(700, 1.0f);
  row[650] = std::numeric_limits<float>::infinity();
  row[690] = std::nanf("");
  row[695] = std::nanf("");
  EXPECT_EQ(pick(row), 690);
}

TEST(GreedyPickTest, AllMinusInfinityPicksTheFirstAndTheLastPartialBlockIsSearched) {
  EXPECT_EQ(pick(std::vector<float>(300, -std::numeric_limits<float>::infinity())), 0);
  std::vector<float> row(513, 0.5f);
  row[512] = 2.0f;
  EXPECT_EQ(pick(row), 512);
}

TEST(GreedyPickTest, SixteenBitFormatsCompareByValue) {
  // bfloat16: -1, 2, 2 (tie), -0 -> the first 2; float16: 0x3C00 (1) below 0x4000 (2)
  const uint16_t bf16[] = {0xBF80, 0x4000, 0x4000, 0x8000};
  EXPECT_EQ(first_largest(bf16, 4, LogitType::kBfloat16), 1);
  const uint16_t f16[] = {0x3C00, 0xC000, 0x4000, 0x7C00, 0x7E00};  // ..., +inf, NaN
  EXPECT_EQ(first_largest(f16, 3, LogitType::kFloat16), 2);
  EXPECT_EQ(first_largest(f16, 5, LogitType::kFloat16), 4);
}

TEST(GreedyPickTest, Float16ConvertsExactlyIncludingSubnormalsAndSpecials) {
  EXPECT_EQ(float16_to_float(0x3C00), 1.0f);
  EXPECT_EQ(float16_to_float(0xC000), -2.0f);
  EXPECT_EQ(float16_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(float16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(float16_to_float(0x83FF), -std::ldexp(1023.0f, -24));
  EXPECT_EQ(float16_to_float(0x0400), std::ldexp(1.0f, -14));
  EXPECT_TRUE(std::signbit(float16_to_float(0x8000)) && float16_to_float(0x8000) == 0.0f);
  EXPECT_EQ(float16_to_float(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(float16_to_float(0x7E00)));
  EXPECT_EQ(bfloat16_to_float(0x3F80), 1.0f);
}

}  // namespace
}  // namespace tileops::engine
