#include "server/object_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "core/refusal.h"

namespace ps::server {
namespace {

using ::testing::HasSubstr;

TEST(ObjectStoreTest, EachWorkerWritesItsOwnKeysAndEveryPutIsANewVersion) {
  ObjectStore store({.num_workers = 3});
  EXPECT_EQ(store.Get(0, "state").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(store.Get(0, "state").status().message()),
              HasSubstr("worker 0 has stored no object 'state'"));
  ASSERT_EQ(*store.Put(0, "state", "a"), 1u);
  ASSERT_EQ(*store.Put(0, "state", "bb"), 2u);
  ASSERT_EQ(*store.Put(1, "state", "mine"), 1u);
  absl::StatusOr<ObjectStore::Object> got = store.Get(0, "state");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->version, 2u);
  EXPECT_EQ(*got->value, "bb");
  EXPECT_EQ(*store.Get(1, "state")->value, "mine") << "worker 1's key is its own";
  EXPECT_EQ(store.bytes(0), std::string("state").size() + 2);
}

TEST(ObjectStoreTest, KeysAndWorkersOutsideTheirBoundsAreRefused) {
  ObjectStore store({.num_workers = 2});
  for (const std::string& key : {std::string(), std::string(129, 'k'), std::string("a b"),
                                std::string("k\n"), std::string("\xff")}) {
    EXPECT_EQ(core::RefusalOf(store.Put(0, key, "v").status()), core::Refusal::kMalformed) << key;
    EXPECT_EQ(core::RefusalOf(store.Get(0, key).status()), core::Refusal::kMalformed) << key;
  }
  EXPECT_TRUE(store.Put(0, std::string(128, 'k'), "v").ok());
  EXPECT_TRUE(store.Put(0, "params/bn1.running_mean:2-x", "v").ok());
  EXPECT_EQ(core::RefusalOf(store.Put(2, "k", "v").status()), core::Refusal::kBadWorkerId);
  EXPECT_EQ(core::RefusalOf(store.Get(7, "k").status()), core::Refusal::kBadWorkerId);
}

TEST(ObjectStoreTest, AWorkersKeysAndBytesAreBoundedAndARefusalKeepsTheOldValue) {
  ObjectStore store({.num_workers = 2, .keys_per_worker = 2, .bytes_per_worker = 100});
  ASSERT_TRUE(store.Put(0, "a", std::string(40, 'x')).ok());
  ASSERT_TRUE(store.Put(0, "b", "y").ok());
  const absl::Status third = store.Put(0, "c", "z").status();
  EXPECT_EQ(core::RefusalOf(third), core::Refusal::kOverLimit);
  EXPECT_THAT(std::string(third.message()), HasSubstr("replace one"));
  // Replacing a key frees its old bytes: 99 of 100 fit, 102 do not.
  ASSERT_TRUE(store.Put(0, "a", std::string(96, 'x')).ok());
  const absl::Status big = store.Put(0, "a", std::string(99, 'x')).status();
  EXPECT_EQ(core::RefusalOf(big), core::Refusal::kOverLimit);
  EXPECT_THAT(std::string(big.message()), HasSubstr("above its 100"));
  EXPECT_EQ(store.Get(0, "a")->value->size(), 96u) << "the refused put changed nothing";
  EXPECT_EQ(store.Get(0, "a")->version, 2u);
  // Another worker's budget is its own.
  EXPECT_TRUE(store.Put(1, "a", std::string(90, 'x')).ok());
  // --max-object-bytes 0: nothing fits.
  ObjectStore none({.num_workers = 1, .bytes_per_worker = 0});
  EXPECT_EQ(core::RefusalOf(none.Put(0, "k", "").status()), core::Refusal::kOverLimit);
}

}  // namespace
}  // namespace ps::server
