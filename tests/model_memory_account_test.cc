// The peak-memory account (model/memory_account.h) on synthetic allocator events, and the labels
// MemoryScope gives them. The account of real CUDA allocations is in model_gpu_test.
#include <gtest/gtest.h>

#include "model/memory_account.h"
#include "model/memory_scope.h"

namespace maskd {
namespace {

constexpr uint64_t kMiB = 1 << 20;

AllocEvent Alloc(uint64_t addr, uint64_t mib, std::string label) { return {true, addr, mib * kMiB, std::move(label)}; }
AllocEvent Free(uint64_t addr, uint64_t mib) { return {false, addr, mib * kMiB, ""}; }

TEST(MemoryAccount, GroupsWhatIsLiveAtThePeakByLabel) {
  // 100 MiB before; a: 10 + 20 live, then b's 50 + 5 on top (peak 185), then frees.
  const std::vector<AllocEvent> ev = {
      Alloc(1, 10, "a"), Alloc(2, 20, "a"), Alloc(3, 50, "b/qkv"), Alloc(4, 5, "b/qkv"),
      Free(3, 50), Free(1, 10), Alloc(5, 30, "c"),  // 150: below the peak
  };
  const MemoryAccount acct = AccountPeak(ev, 100 * kMiB);
  EXPECT_EQ(acct.peak_bytes, 185 * kMiB);
  EXPECT_EQ(acct.before_bytes, 100 * kMiB);
  ASSERT_EQ(acct.rows.size(), 2u);
  EXPECT_EQ(acct.rows[0].label, "b/qkv");  // largest first
  EXPECT_EQ(acct.rows[0].bytes, 55 * kMiB);
  EXPECT_EQ(acct.rows[0].count, 2);
  EXPECT_EQ(acct.rows[0].largest, 50 * kMiB);
  EXPECT_EQ(acct.rows[1].label, "a");
  EXPECT_EQ(acct.rows[1].bytes, 30 * kMiB);
  EXPECT_EQ(acct.events, ev.size());
}

TEST(MemoryAccount, FreesOfOlderBlocksLowerWhatWasThereBefore) {
  // 100 MiB before; 60 of them freed, then 40 allocated: the peak stays the 100 before the work.
  const MemoryAccount early = AccountPeak({Free(9, 60), Alloc(1, 40, "x")}, 100 * kMiB);
  EXPECT_EQ(early.peak_bytes, 100 * kMiB);
  EXPECT_TRUE(early.rows.empty());
  EXPECT_EQ(early.before_bytes, 100 * kMiB);
  // 70 allocated after the free: 40 + 70 + 80 = 190 at the peak, with only 40 of the old blocks.
  const MemoryAccount late = AccountPeak({Free(9, 60), Alloc(1, 80, "x"), Alloc(2, 70, "")}, 100 * kMiB);
  EXPECT_EQ(late.peak_bytes, 190 * kMiB);
  EXPECT_EQ(late.before_bytes, 40 * kMiB);
  ASSERT_EQ(late.rows.size(), 2u);
  EXPECT_EQ(late.rows[0].label, "x");
  EXPECT_EQ(late.rows[1].label, "(unlabelled)");
  // The same address reused after a free is a new block.
  const MemoryAccount reused = AccountPeak({Alloc(1, 10, "p"), Free(1, 10), Alloc(1, 30, "q")}, 0);
  EXPECT_EQ(reused.peak_bytes, 30 * kMiB);
  ASSERT_EQ(reused.rows.size(), 1u);
  EXPECT_EQ(reused.rows[0].label, "q");
}

TEST(MemoryAccount, TableNamesThePartsAndTheirSum) {
  const MemoryAccount acct = AccountPeak({Alloc(1, 64, "Encode/encoder/block.global/attention")}, 36 * kMiB);
  const std::string t = FormatMemoryAccount(acct);
  EXPECT_NE(t.find("peak 100.0 MiB = 36.0 MiB allocated before the work + 64.0 MiB"), std::string::npos) << t;
  EXPECT_NE(t.find("Encode/encoder/block.global/attention"), std::string::npos) << t;
}

TEST(MemoryScope, NestsPerThread) {
  EXPECT_EQ(MemoryScope::Current(), "");
  {
    MemoryScope a("Encode");
    {
      MemoryScope b("encoder");
      MemoryScope c("block.windowed");
      EXPECT_EQ(MemoryScope::Current(), "Encode/encoder/block.windowed");
    }
    EXPECT_EQ(MemoryScope::Current(), "Encode");
  }
  EXPECT_EQ(MemoryScope::Current(), "");
}

TEST(MemoryAccount, WithoutADeviceTheRecordingIsRefusedNotAttempted) {
  bool ran = false;
  auto acct = AccountDevicePeak(0, [&] {
    ran = true;
    return Status::Ok();
  });
  if (acct.ok()) GTEST_SKIP() << "a CUDA device is present: model_gpu_test covers the recording";
  EXPECT_EQ(acct.status().code(), StatusCode::kFailedPrecondition) << acct.status().ToString();
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace maskd
