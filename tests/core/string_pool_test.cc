// StringPool: a lent string comes back when its last reference goes, as long as it was,
// and the pool keeps no more than the most one Take asked for (or its bound); TakeOne
// takes one without raising the bound.
#include "core/string_pool.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace ps::core {
namespace {

TEST(StringPoolTest, ALentStringComesBackWhenItsLastReferenceGoes) {
  auto pool = std::make_shared<StringPool>();
  std::vector<std::string> payloads;
  pool->Take(2, &payloads);
  ASSERT_EQ(payloads.size(), 2u);
  EXPECT_TRUE(payloads[0].empty() && payloads[1].empty());  // nothing to reuse yet
  payloads[0].assign(1000, 'a');
  payloads[1].assign(3000, 'b');
  const char* first = payloads[0].data();
  std::shared_ptr<const std::string> a = pool->Lend(std::move(payloads[0]));
  std::shared_ptr<const std::string> b = pool->Lend(std::move(payloads[1]));
  EXPECT_EQ(a->data(), first);  // shared, not copied
  EXPECT_EQ(*a, std::string(1000, 'a'));
  std::shared_ptr<const std::string> a_again = a;
  a.reset();
  EXPECT_EQ(pool->free_count(), 0u);  // a_again still holds it
  a_again.reset();
  b.reset();
  EXPECT_EQ(pool->free_count(), 2u);
  pool->Take(3, &payloads);
  ASSERT_EQ(payloads.size(), 3u);
  // The last one given back comes first, with its length and bytes; then the other;
  // then a new, empty one.
  EXPECT_EQ(payloads[0], std::string(3000, 'b'));
  EXPECT_EQ(payloads[1], std::string(1000, 'a'));
  EXPECT_EQ(payloads[1].data(), first);
  EXPECT_TRUE(payloads[2].empty());
  EXPECT_EQ(pool->free_count(), 0u);
}

TEST(StringPoolTest, KeepsNoMoreThanTheMostStringsOneTakeAskedFor) {
  auto pool = std::make_shared<StringPool>();
  std::vector<std::string> payloads;
  pool->Take(2, &payloads);
  std::vector<std::shared_ptr<const std::string>> sent;
  for (int i = 0; i < 5; ++i) sent.push_back(pool->Lend(std::string(100, 'x')));
  sent.clear();
  EXPECT_EQ(pool->free_count(), 2u);  // the other three were freed
}

TEST(StringPoolTest, ALentStringMayOutliveThePoolsOwnerAndIsGivenBackOnAnotherThread) {
  std::shared_ptr<std::string> payload;
  std::weak_ptr<StringPool> weak;
  {
    auto pool = std::make_shared<StringPool>();
    weak = pool;
    std::vector<std::string> payloads;
    pool->Take(1, &payloads);
    payloads[0] = "bytes in flight";
    payload = pool->Lend(std::move(payloads[0]));
  }
  EXPECT_FALSE(weak.expired());  // the lent string keeps its pool
  std::thread([p = std::move(payload)]() mutable {
    EXPECT_EQ(*p, "bytes in flight");
    p.reset();
  }).join();
  EXPECT_TRUE(weak.expired());  // given back, then the pool went with its last payload
}

TEST(StringPoolTest, ABoundGivenAtTheStartHoldsForKeepAndLend) {
  auto pool = std::make_shared<StringPool>(2);
  pool->Keep(std::string(10, 'k'));
  std::shared_ptr<std::string> a = pool->Lend(std::string(20, 'a'));
  std::shared_ptr<std::string> b = pool->Lend(std::string(30, 'b'));
  a.reset();
  EXPECT_EQ(pool->free_count(), 2u);
  b.reset();  // over the bound: freed, not kept
  EXPECT_EQ(pool->free_count(), 2u);
  std::vector<std::string> taken;
  pool->Take(1, &taken);  // asks for less than the bound: the bound stays 2
  EXPECT_EQ(taken[0], std::string(20, 'a'));
  pool->Keep(std::move(taken[0]));
  pool->Keep(std::string(5, 'c'));
  EXPECT_EQ(pool->free_count(), 2u);
}

TEST(StringPoolTest, TakeOneGivesTheLastGivenBackThenAnEmptyOneAndKeepsTheBound) {
  auto pool = std::make_shared<StringPool>(1);
  const std::string first = pool->TakeOne();
  EXPECT_TRUE(first.empty());  // nothing to reuse yet
  std::shared_ptr<std::string> a = pool->Lend(std::string(40, 'a'));
  const char* bytes = a->data();
  a.reset();
  EXPECT_EQ(pool->free_count(), 1u);
  std::string again = pool->TakeOne();
  EXPECT_EQ(again, std::string(40, 'a'));  // its bytes left in it
  EXPECT_EQ(again.data(), bytes);          // the same buffer, not a copy
  EXPECT_EQ(pool->free_count(), 0u);
  EXPECT_TRUE(pool->TakeOne().empty());
  pool->Keep(std::move(again));
  pool->Keep(std::string(8, 'b'));  // TakeOne did not raise the bound of 1
  EXPECT_EQ(pool->free_count(), 1u);
}

}  // namespace
}  // namespace ps::core
