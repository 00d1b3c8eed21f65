// net::DataStream's exact reads and whole writes over loopback TCP: the receive low-water
// mark follows what is left of a read, so a body that arrives in parts with pauses between
// them is read in full, a short read after a long one is not held back by the long one's
// mark, and a gather list longer than Asio's 64 KiB per call is written whole. Reads
// ahead: a run of short records sent at once is read with one system call and taken in
// order without waiting (ReadNow), a record not all there is not taken in part, and a
// long read after a short one gets the bytes read ahead first, the rest straight.
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include "gtest/gtest.h"
#include "net/data_stream_internal.h"

namespace ps::net {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using namespace std::chrono_literals;

// A connected pair on loopback: `stream` (a DataStream on `io`) and `peer` (a plain
// blocking socket driven from the test's thread).
struct Pair {
  asio::io_context io;
  tcp::socket peer{io};
  std::unique_ptr<DataStream> stream;

  Pair() {
    tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    peer.connect(acceptor.local_endpoint());
    stream = std::make_unique<DataStream>(acceptor.accept());
    stream->ReadAhead();
  }

  int LowWater() {
    int mark = 0;
    socklen_t len = sizeof(mark);
    ::getsockopt(stream->socket().native_handle(), SOL_SOCKET, SO_RCVLOWAT, &mark, &len);
    return mark;
  }

  // Runs `io` until `done` is set or `limit` passed; whether it was set.
  bool RunUntil(const bool& done, std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!done && std::chrono::steady_clock::now() < end) {
      io.run_for(10ms);
      io.restart();
    }
    return done;
  }
};

std::vector<char> Pattern(size_t n) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(i * 131 + 7);
  return v;
}

TEST(DataStreamTest, ABodySentInPartsWithPausesIsReadWholeAndTheNextShortReadIsNotHeldBack) {
  Pair p;
  constexpr size_t kBody = 600 * 1024;  // above the mark's cap: three parts below
  const std::vector<char> sent = Pattern(kBody);
  std::vector<char> got(kBody);
  bool done = false;
  boost::system::error_code result;
  size_t read = 0;
  p.stream->AsyncReadExactly(asio::buffer(got), [&](const boost::system::error_code& ec, size_t n) {
    result = ec;
    read = n;
    done = true;
  });
  // 100 KiB, a pause, 250 KiB, a pause, the rest: a mark left at what was first asked for
  // (or at the cap once less is left) would never see the rest arrive in full.
  std::thread writer([&] {
    const size_t parts[] = {100 * 1024, 250 * 1024, kBody - 350 * 1024};
    size_t at = 0;
    for (size_t n : parts) {
      asio::write(p.peer, asio::buffer(sent.data() + at, n));
      at += n;
      std::this_thread::sleep_for(50ms);
    }
  });
  const bool finished = p.RunUntil(done, 10s);
  writer.join();
  ASSERT_TRUE(finished) << "the exact read never completed (low-water mark " << p.LowWater()
                        << ")";
  ASSERT_FALSE(result) << result.message();
  EXPECT_EQ(read, kBody);
  EXPECT_TRUE(got == sent);

  // Then a 16-byte header: its read asks for the usual one byte and completes.
  std::array<char, 16> header{};
  done = false;
  p.stream->AsyncReadExactly(asio::buffer(header),
                             [&](const boost::system::error_code& ec, size_t) {
                               result = ec;
                               done = true;
                             });
  EXPECT_EQ(p.LowWater(), 1);
  const std::string sixteen = "0123456789abcdef";
  asio::write(p.peer, asio::buffer(sixteen));
  ASSERT_TRUE(p.RunUntil(done, 5s)) << "a 16-byte read after a long one never completed";
  ASSERT_FALSE(result);
  EXPECT_EQ(std::string(header.data(), header.size()), sixteen);
}

TEST(DataStreamTest, TheMarkFollowsWhatIsLeftWithinItsBounds) {
  Pair p;
  // A long read sets the cap; once less than the floor is left the mark is back at 1.
  p.stream->SetReadLowWater(DataStream::kMaxReadLowWater * 4);
  EXPECT_EQ(p.LowWater(), static_cast<int>(DataStream::kMaxReadLowWater));
  p.stream->SetReadLowWater(DataStream::kMinReadLowWater + 100);
  EXPECT_EQ(p.LowWater(), static_cast<int>(DataStream::kMinReadLowWater + 100));
  p.stream->SetReadLowWater(DataStream::kMinReadLowWater - 1);
  EXPECT_EQ(p.LowWater(), 1);
}

TEST(DataStreamTest, AGatherListLongerThanOneCallsWorthIsWrittenWhole) {
  Pair p;
  // 40 pieces of 20 KiB (800 KiB): more than one socket buffer and than Asio's 64 KiB.
  std::vector<std::vector<char>> pieces;
  std::vector<asio::const_buffer> buffers;
  pieces.reserve(40);
  for (int i = 0; i < 40; ++i) {
    pieces.push_back(Pattern(20 * 1024 + i));
    buffers.push_back(asio::buffer(pieces.back()));
  }
  const size_t total = asio::buffer_size(buffers);
  bool done = false;
  boost::system::error_code result;
  size_t written = 0;
  p.stream->AsyncWriteAll(buffers, [&](const boost::system::error_code& ec, size_t n) {
    result = ec;
    written = n;
    done = true;
  });
  std::promise<std::string> received;
  std::thread reader([&] {
    std::string all(total, '\0');
    boost::system::error_code ec;
    asio::read(p.peer, asio::buffer(all), ec);
    received.set_value(ec ? std::string() : all);
  });
  const bool finished = p.RunUntil(done, 10s);
  reader.join();
  ASSERT_TRUE(finished);
  ASSERT_FALSE(result) << result.message();
  EXPECT_EQ(written, total);
  std::string expected;
  for (const std::vector<char>& piece : pieces) expected.append(piece.data(), piece.size());
  EXPECT_TRUE(received.get_future().get() == expected);
}

// Waits until the socket under `p.stream` has `n` bytes queued to read.
void AwaitQueued(Pair& p, size_t n) {
  const auto end = std::chrono::steady_clock::now() + 5s;
  while (p.stream->socket().available() < n && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_GE(p.stream->socket().available(), n);
}

TEST(DataStreamTest, ARunOfShortRecordsIsTakenInOrderWithoutWaitingAndOneReadOfTheSocket) {
  Pair p;
  constexpr size_t kRecords = DataStream::kMaxReadsNow, kRecord = 24;  // under kStageBytes
  const std::vector<char> sent = Pattern(kRecords * kRecord);
  asio::write(p.peer, asio::buffer(sent));
  AwaitQueued(p, sent.size());
  std::array<char, kRecord> record{};
  for (size_t i = 0; i < kRecords; ++i) {
    ASSERT_TRUE(p.stream->ReadNow(asio::buffer(record))) << "record " << i;
    ASSERT_TRUE(std::equal(record.begin(), record.end(), sent.begin() + i * kRecord))
        << "record " << i;
    // The first ReadNow read them all: nothing is left in the socket.
    EXPECT_EQ(p.stream->socket().available(), 0u) << "record " << i;
  }
  EXPECT_FALSE(p.stream->ReadNow(asio::buffer(record))) << "nothing more was sent";
}

TEST(DataStreamTest, AfterItsBoundInARowReadNowWaitsForAnAsynchronousRead) {
  Pair p;
  constexpr size_t kRecord = 16, kRecords = DataStream::kMaxReadsNow + 2;
  const std::vector<char> sent = Pattern(kRecords * kRecord);
  asio::write(p.peer, asio::buffer(sent));
  AwaitQueued(p, sent.size());
  std::array<char, kRecord> record{};
  for (size_t i = 0; i < DataStream::kMaxReadsNow; ++i) {
    ASSERT_TRUE(p.stream->ReadNow(asio::buffer(record))) << "record " << i;
  }
  EXPECT_FALSE(p.stream->ReadNow(asio::buffer(record))) << "past the bound, bytes read ahead";
  bool done = false;
  p.stream->AsyncReadExactly(asio::buffer(record),
                             [&](const boost::system::error_code& ec, size_t) {
                               EXPECT_FALSE(ec);
                               done = true;
                             });
  ASSERT_TRUE(p.RunUntil(done, 5s));
  EXPECT_TRUE(std::equal(record.begin(), record.end(),
                         sent.begin() + DataStream::kMaxReadsNow * kRecord));
  ASSERT_TRUE(p.stream->ReadNow(asio::buffer(record))) << "the bound starts again";
  EXPECT_TRUE(std::equal(record.begin(), record.end(), sent.end() - kRecord));
}

TEST(DataStreamTest, ARecordNotAllThereIsNotTakenInPartAndTheExactReadCompletesIt) {
  Pair p;
  const std::vector<char> sent = Pattern(16);
  asio::write(p.peer, asio::buffer(sent.data(), 10));
  AwaitQueued(p, 10);
  std::array<char, 16> header{};
  EXPECT_FALSE(p.stream->ReadNow(asio::buffer(header)));
  EXPECT_FALSE(p.stream->ReadNow(asio::buffer(header))) << "asked again: still 10 of 16";
  bool done = false;
  boost::system::error_code result;
  size_t read = 0;
  p.stream->AsyncReadExactly(asio::buffer(header),
                             [&](const boost::system::error_code& ec, size_t n) {
                               result = ec;
                               read = n;
                               done = true;
                             });
  asio::write(p.peer, asio::buffer(sent.data() + 10, 6));
  ASSERT_TRUE(p.RunUntil(done, 5s));
  ASSERT_FALSE(result) << result.message();
  EXPECT_EQ(read, 16u);
  EXPECT_TRUE(std::equal(header.begin(), header.end(), sent.begin()));
}

TEST(DataStreamTest, ALongReadAfterAShortOneGetsTheBytesReadAheadFirstAcrossTwoBuffers) {
  Pair p;
  // A 16-byte header, then an 8-byte version and 600 KiB of values in one write: the
  // header's ReadNow reads ahead into the version and the values.
  constexpr size_t kValues = 600 * 1024;
  const std::vector<char> sent = Pattern(16 + 8 + kValues);
  std::thread writer([&] { asio::write(p.peer, asio::buffer(sent)); });
  std::array<char, 16> header{};
  const auto end = std::chrono::steady_clock::now() + 5s;
  bool have_header = false;
  while (!have_header && std::chrono::steady_clock::now() < end) {
    have_header = p.stream->ReadNow(asio::buffer(header));
    if (!have_header) std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(have_header);
  EXPECT_TRUE(std::equal(header.begin(), header.end(), sent.begin()));
  uint64_t version = 0;
  std::vector<char> values(kValues);
  bool done = false;
  boost::system::error_code result;
  size_t read = 0;
  p.stream->AsyncReadExactly(
      DataStream::ReadBuffers{asio::buffer(&version, sizeof(version)), asio::buffer(values)},
      [&](const boost::system::error_code& ec, size_t n) {
        result = ec;
        read = n;
        done = true;
      });
  const bool finished = p.RunUntil(done, 10s);
  writer.join();
  ASSERT_TRUE(finished);
  ASSERT_FALSE(result) << result.message();
  EXPECT_EQ(read, 8 + kValues);
  EXPECT_EQ(std::memcmp(&version, sent.data() + 16, 8), 0);
  EXPECT_TRUE(std::equal(values.begin(), values.end(), sent.begin() + 24));
}

TEST(DataStreamTest, AReadWhollyReadAheadCompletesThroughTheExecutorNotWithinTheCall) {
  Pair p;
  const std::vector<char> sent = Pattern(64);
  asio::write(p.peer, asio::buffer(sent));
  AwaitQueued(p, sent.size());
  std::array<char, 16> first{}, second{};
  ASSERT_TRUE(p.stream->ReadNow(asio::buffer(first)));  // reads all 64 ahead
  bool done = false;
  p.stream->AsyncReadExactly(asio::buffer(second),
                             [&](const boost::system::error_code& ec, size_t n) {
                               EXPECT_FALSE(ec);
                               EXPECT_EQ(n, 16u);
                               done = true;
                             });
  EXPECT_FALSE(done) << "the handler ran within AsyncReadExactly";
  ASSERT_TRUE(p.RunUntil(done, 5s));
  EXPECT_TRUE(std::equal(second.begin(), second.end(), sent.begin() + 16));
}

TEST(DataStreamTest, BeforeReadAheadEveryReadIsExactAndNothingIsKeptForThePeer) {
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
  tcp::socket peer(io);
  peer.connect(acceptor.local_endpoint());
  DataStream stream(acceptor.accept());  // no ReadAhead: a peer not yet admitted
  const std::vector<char> sent = Pattern(64);
  asio::write(peer, asio::buffer(sent));
  const auto end = std::chrono::steady_clock::now() + 5s;
  while (stream.socket().available() < sent.size() && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(stream.socket().available(), sent.size());
  std::array<char, 16> header{};
  EXPECT_FALSE(stream.ReadNow(asio::buffer(header)));
  bool done = false;
  stream.AsyncReadExactly(asio::buffer(header), [&](const boost::system::error_code& ec, size_t n) {
    EXPECT_FALSE(ec);
    EXPECT_EQ(n, 16u);
    done = true;
  });
  while (!done && std::chrono::steady_clock::now() < end) {
    io.run_for(10ms);
    io.restart();
  }
  ASSERT_TRUE(done);
  EXPECT_TRUE(std::equal(header.begin(), header.end(), sent.begin()));
  EXPECT_EQ(stream.socket().available(), sent.size() - 16) << "read past what was asked for";
}

}  // namespace
}  // namespace ps::net
