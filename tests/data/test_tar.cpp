// SPDX-License-Identifier: MIT
// The streaming tar reader against archives Python's tarfile wrote (PAX with per-member 'x'
// headers, GNU with 'L'/'K', a USTAR test vector with known bytes), TarWriter round trips,
// truncated / corrupt archives, and TarShardDataset's stoppable start().
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <trainkit/data/tar_shards.hpp>
#include <trainkit/io/tar.hpp>

#include "data_test_util.hpp"
#include "support/file_size_limit.hpp"

namespace tk = trainkit;
using data_test::check_contains;
using data_test::error_of;
using data_test::fixture;
using data_test::read_file;
using data_test::TempDir;
using data_test::write_file;

namespace {

struct Member {
  std::string name;
  char type;
  std::string data;
  std::string linkname;
};

std::vector<Member> read_all(tk::io::TarReader tar) {
  std::vector<Member> out;
  while (tar.next()) {
    const tk::io::TarEntry& e = tar.entry();
    std::string data;
    if (e.is_file()) {
      const std::vector<std::byte> bytes = tar.read_data();
      data.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    }
    out.push_back({e.name, e.type, data, e.linkname});
  }
  return out;
}

std::vector<Member> read_all_memory(const std::vector<std::byte>& bytes) {
  return read_all(tk::io::TarReader::from_memory(bytes, "mem.tar"));
}

/// The expected files of sample `k` in gen_fixtures.py's shards (sorted extensions).
std::vector<std::pair<std::string, std::string>> sample_files(int k) {
  std::string bin;
  for (int j = 0; j < 8; ++j) bin += static_cast<char>((k + j) % 256);
  return {{"bin", bin},
          {"cls", std::to_string(k % 10)},
          {"json", "[" + std::to_string(k) + ", " + std::to_string(-k) + "]"},
          {"npy", ""},  // checked by the dataset tests
          {"txt", "sample " + std::to_string(k)}};
}

using data_test::set_checksum;

}  // namespace

TEST_CASE("tar: the USTAR test vector (CPython tarfile, four members)") {
  tk::io::TarReader tar = tk::io::TarReader::open(fixture("tar/ustar_vector.tar"));
  const char* names[] = {"000000.cls", "000000.json", "000001.cls", "000001.json"};
  const char* data[] = {"3", "{\"a\":1}", "7", "{\"a\":2}"};
  for (int i = 0; i < 4; ++i) {
    REQUIRE(tar.next());
    CHECK(tar.entry().name == names[i]);
    CHECK(tar.entry().offset == static_cast<std::uint64_t>(1024 * i));
    CHECK(tar.entry().type == '0');
    CHECK(tar.entry().mode == 0444);
    CHECK(tar.entry().mtime == 1700000000);
    const std::vector<std::byte> d = tar.read_data();
    CHECK(std::string(reinterpret_cast<const char*>(d.data()), d.size()) == data[i]);
  }
  CHECK_FALSE(tar.next());
  CHECK_FALSE(tar.next());
}

TEST_CASE("tar: PAX shards from tarfile (a pax 'x' header before every member)") {
  for (int s = 0; s < 3; ++s) {
    CAPTURE(s);
    const std::string path = fixture("tar/wds-00000" + std::to_string(s) + ".tar");
    const std::vector<Member> from_file = read_all(tk::io::TarReader::open(path));
    const std::vector<Member> from_memory = read_all_memory(read_file(path));
    REQUIRE(from_file.size() == from_memory.size());
    std::size_t m = 0;
    if (s == 1) {  // gen_fixtures.py adds a directory and a metadata file to shard 1
      REQUIRE(from_file.size() >= 2);
      CHECK(from_file[0].name == "subdir/");
      CHECK(from_file[0].type == '5');
      CHECK(from_file[1].name == "__meta__");
      CHECK(from_file[1].data == "ignore me");
      m = 2;
    }
    REQUIRE(from_file.size() == m + 7 * 5);
    for (int i = 0; i < 7; ++i) {
      const int k = s * 100 + i;
      char key[8];
      std::snprintf(key, sizeof key, "%06d", k);
      for (const auto& [ext, content] : sample_files(k)) {
        CHECK(from_file[m].name == std::string(key) + "." + ext);
        CHECK(from_file[m].name == from_memory[m].name);
        CHECK(from_file[m].data == from_memory[m].data);
        if (ext != "npy") CHECK(from_file[m].data == content);
        ++m;
      }
    }
  }
}

TEST_CASE("tar: GNU long names ('L') and long link targets ('K')") {
  const std::vector<Member> members =
      read_all(tk::io::TarReader::open(fixture("tar/gnu_long.tar")));
  std::string dir;
  for (int i = 0; i < 4; ++i) dir += "a_rather_long_directory_name_";
  REQUIRE(members.size() == 3 * 5 + 1);
  CHECK(members[0].name == dir + "/000000.bin");
  CHECK(members[0].name.size() > 100);
  CHECK(members[6].name == dir + "/000001.cls");
  CHECK(members[6].data == "1");
  CHECK(members.back().name == "link.txt");
  CHECK(members.back().type == '2');
  CHECK(members.back().linkname == dir + "/target.txt");
}

TEST_CASE("tar: TarWriter round trip, long names through pax, base-256 sizes") {
  TempDir dir;
  const std::string long_name = std::string(150, 'n') + ".bin";
  {
    tk::io::TarWriter w(dir / "w.tar");
    w.add("a.txt", std::string_view("hello"));
    w.add(long_name, std::string(1000, 'x'));
    w.add("empty.cls", std::string_view(""));
    w.close();
  }
  const std::vector<std::byte> bytes = read_file(dir / "w.tar");
  CHECK(bytes.size() % 10240 == 0);
  const std::vector<Member> members = read_all_memory(bytes);
  REQUIRE(members.size() == 3);
  CHECK(members[0].name == "a.txt");
  CHECK(members[0].data == "hello");
  CHECK(members[1].name == long_name);
  CHECK(members[1].data == std::string(1000, 'x'));
  CHECK(members[2].name == "empty.cls");
  CHECK(members[2].data.empty());

  // GNU base-256 size field: 0x80 then the big-endian value.
  std::vector<std::byte> b256 = read_file(fixture("tar/ustar_vector.tar"));
  std::memset(b256.data() + 124, 0, 12);
  b256[124] = std::byte{0x80};
  b256[135] = std::byte{1};
  set_checksum(b256, 0);
  const std::vector<Member> m2 = read_all_memory(b256);
  REQUIRE(m2.size() == 4);
  CHECK(m2[0].data == "3");
}

TEST_CASE("tar: TarWriter replaces the archive only when it closes") {
  TempDir dir;
  const std::filesystem::path path = dir / "w.tar";
  {
    tk::io::TarWriter w(path);
    w.add("old.txt", std::string_view("old"));
    w.close();
  }
  const auto members_at_path = [&] { return read_all(tk::io::TarReader::open(path)); };
  const auto files_in_dir = [&] {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir.path()))
      names.push_back(e.path().filename().string());
    return names;
  };
  REQUIRE(members_at_path().size() == 1);

  // While a new archive is written, the path still holds the old one.
  {
    tk::io::TarWriter w(path);
    w.add("new.txt", std::string_view("new"));
    const std::vector<Member> during = members_at_path();
    REQUIRE(during.size() == 1);
    CHECK(during[0].name == "old.txt");
    w.close();
  }
  std::vector<Member> now = members_at_path();
  REQUIRE(now.size() == 1);
  CHECK(now[0].name == "new.txt");

  // An exception between add() calls drops the new archive (no commit from the destructor).
  try {
    tk::io::TarWriter w(path);
    w.add("dropped.txt", std::string_view("x"));
    throw std::runtime_error("the converter failed");
  } catch (const std::runtime_error&) {
  }
  now = members_at_path();
  REQUIRE(now.size() == 1);
  CHECK(now[0].name == "new.txt");
  CHECK(files_in_dir() == std::vector<std::string>{"w.tar"});

  // A write that fails part-way (a file size limit, as a full disk): a clear error naming the
  // archive, and the old archive whole.
  const std::string big(std::size_t{2} << 20, 'b');
  const std::string error = trainkit_test::error_under_file_size_limit(100000, [&] {
    tk::io::TarWriter w(path);
    w.add("small.txt", std::string_view("s"));
    w.add("big.bin", big);
    w.close();
  });
  check_contains(error, {"w.tar", "EFBIG", "previous file is intact"});
  now = members_at_path();
  REQUIRE(now.size() == 1);
  CHECK(now[0].name == "new.txt");
  CHECK(files_in_dir() == std::vector<std::string>{"w.tar"});

  // add() after close() is an error naming the archive.
  tk::io::TarWriter w(path);
  w.close();
  check_contains(error_of([&] { w.add("late.txt", std::string_view("x")); }),
                 {"w.tar", "add() after close()"});
  CHECK(members_at_path().empty());
}

TEST_CASE("tar: truncated archives are errors naming the archive, never silent") {
  const std::vector<std::byte> good = read_file(fixture("tar/wds-000000.tar"));
  // Find the data offsets to cut inside a member, a header and padding.
  std::size_t clean = 0, errors = 0;
  for (std::size_t cut = 1; cut < 6000; cut += 97) {
    CAPTURE(cut);
    const std::vector<std::byte> part(good.begin(),
                                      good.begin() + static_cast<std::ptrdiff_t>(cut));
    try {
      read_all_memory(part);
      // Only a cut exactly on a header boundary after a complete member may end cleanly.
      CHECK(cut % 512 == 0);
      ++clean;
    } catch (const tk::Error& e) {
      check_contains(e.what(), {"mem.tar", "truncated"});
      ++errors;
    }
  }
  CHECK(errors > 50);
  // Cutting inside member data: the message names the member.
  tk::io::TarReader tar = tk::io::TarReader::from_memory(
      std::span(good).first(1024 + 512 + 3), "cut.tar");  // pax header, header, 3 data bytes
  REQUIRE(tar.next());
  check_contains(error_of([&] { (void)tar.read_data(); }),
                 {"cut.tar", "truncated", "member '000000.bin' declares 8 bytes"});
}

TEST_CASE("tar: corrupt headers, gzip and non-tar input") {
  std::vector<std::byte> bad = read_file(fixture("tar/ustar_vector.tar"));
  bad[10] = std::byte{'X'};  // inside the name: checksum mismatch
  check_contains(error_of([&] { read_all_memory(bad); }), {"mem.tar", "bad header checksum"});

  std::vector<std::byte> size = read_file(fixture("tar/ustar_vector.tar"));
  std::memcpy(size.data() + 124, "0000000009z", 11);
  set_checksum(size, 0);
  check_contains(error_of([&] { read_all_memory(size); }), {"mem.tar", "bad size field"});

  std::vector<std::byte> gz(1024, std::byte{0});
  gz[0] = std::byte{0x1f};
  gz[1] = std::byte{0x8b};
  check_contains(error_of([&] { read_all_memory(gz); }), {"gzip-compressed", "gunzip"});

  std::vector<std::byte> text(2048, std::byte{'a'});
  check_contains(error_of([&] { read_all_memory(text); }), {"mem.tar", "not a tar archive"});

  // A pax record whose length field lies.
  TempDir dir;
  {
    tk::io::TarWriter w(dir / "p.tar");
    w.add(std::string(120, 'p'), std::string_view("data"));
  }
  std::vector<std::byte> pax = read_file(dir / "p.tar");
  pax[512] = std::byte{'9'};  // "133 path=..." -> "933 path=..."
  check_contains(error_of([&] { read_all_memory(pax); }), {"mem.tar", "corrupt pax record"});

  check_contains(error_of([] { tk::io::TarReader::open("/nonexistent/x.tar"); }),
                 {"/nonexistent/x.tar", "cannot open"});
}

namespace {

/// A shard of `samples` samples, sample k one `.cls` member holding `first + k`.
void write_label_shard(const std::filesystem::path& path, int first, int samples) {
  tk::io::TarWriter w(path, {.durable = false});
  for (int k = 0; k < samples; ++k) {
    char key[32];
    std::snprintf(key, sizeof key, "%07d.cls", first + k);
    w.add(key, std::to_string(first + k));
  }
  w.close();
}

tk::data::TarShardOptions label_options() {
  tk::data::TarShardOptions o;
  o.fields = {{"label", "cls", tk::DType::kI64, {}}};
  return o;
}

/// The labels the stream returns from its current position to the end of the epoch.
std::vector<std::int64_t> read_rest(tk::data::TarShardDataset& ds) {
  std::int64_t label = 0;
  const std::span<std::byte> field(reinterpret_cast<std::byte*>(&label), sizeof label);
  const tk::data::SampleRef out(std::span<const std::span<std::byte>>(&field, 1));
  std::vector<std::int64_t> labels;
  while (ds.next(out)) labels.push_back(label);
  return labels;
}

/// The sample count in next()'s error after a stopped start() ("was stopped after K samples").
std::uint64_t stopped_after(tk::data::TarShardDataset& ds) {
  const std::string m = error_of([&] { (void)read_rest(ds); });
  const std::size_t at = m.find("was stopped after ");
  REQUIRE_MESSAGE(at != std::string::npos, m);
  return std::stoull(m.substr(at + 18));
}

}  // namespace

TEST_CASE("tar shards: a start() given a stop flag gives up and leaves the dataset usable") {
  TempDir dir;
  std::mt19937 rng(2024);
  std::vector<std::string> shards;
  int total = 0;
  for (int s = 0; s < 12; ++s) {
    const int n = 1 + static_cast<int>(rng() % 40);
    shards.push_back((dir / ("shard-" + std::to_string(s) + ".tar")).string());
    write_label_shard(shards.back(), total, n);
    total += n;
  }
  const std::atomic<bool> stop_now{true}, never{false};
  for (int trial = 0; trial < 24; ++trial) {
    CAPTURE(trial);
    tk::data::TarShardOptions o = label_options();
    o.seed = rng();
    o.shuffle_shards = rng() % 2 == 0;
    o.shuffle_buffer = std::vector<std::size_t>{0, 1, 7, 100000}[rng() % 4];
    o.world_size = 1 + rng() % 3;
    o.rank = rng() % o.world_size;
    const std::uint64_t epoch = rng() % 5;
    CAPTURE(o.shuffle_buffer);
    tk::data::TarShardDataset reference(shards, o);
    reference.start(epoch, 0);
    const std::vector<std::int64_t> all = read_rest(reference);
    REQUIRE(!all.empty());
    const std::uint64_t n = all.size();

    tk::data::TarShardDataset ds(shards, o);
    // A stop already requested: nothing is read, and next() refuses the unpositioned stream.
    CHECK_FALSE(ds.start(epoch, n, stop_now));
    CHECK(stopped_after(ds) == 0);
    check_contains(error_of([&] { (void)read_rest(ds); }),
                   {"TarShardDataset: start(epoch " + std::to_string(epoch) + ", skip " +
                        std::to_string(n) + ") was stopped after 0 samples",
                    "call start() again"});
    // Then it starts anywhere as if it never stopped, with or without a flag.
    const std::uint64_t j = rng() % (n + 1);
    if (rng() % 2 == 0) {
      ds.start(epoch, j);
    } else {
      CHECK(ds.start(epoch, j, never));
    }
    CHECK(read_rest(ds) == std::vector<std::int64_t>(all.begin() + std::ptrdiff_t(j), all.end()));
    // A flag that stays false changes nothing: a skip past the end is still an error.
    check_contains(error_of([&] { (void)ds.start(epoch, n + 1, never); }),
                   {"cannot skip to sample " + std::to_string(n + 1), "has only"});
    CHECK(ds.start(epoch, 0, stop_now));  // nothing to skip: positioned
    CHECK(read_rest(ds) == all);
  }
}

TEST_CASE("tar shards: a stop from another thread ends start()'s skip where it is") {
  // The reader thread skips through `before` samples of regular shards, then opens a FIFO; the
  // test opens the FIFO's other end (so the skip has reached it), sets the flag, then feeds the
  // FIFO one shard. After it come 50 shards that do not exist: a start() that went on would
  // throw "cannot open" instead of returning false, however slow or fast the machine.
  for (const std::size_t buffer : {std::size_t{0}, std::size_t{5}, std::size_t{100000}}) {
    CAPTURE(buffer);
    TempDir dir;
    std::vector<std::string> shards;
    int before = 0;
    for (int s = 0; s < 4; ++s) {
      shards.push_back((dir / ("shard-" + std::to_string(s) + ".tar")).string());
      write_label_shard(shards.back(), before, 10 + 7 * s);
      before += 10 + 7 * s;
    }
    write_label_shard(dir / "fed.tar", before, 3);
    const std::vector<std::byte> fed = read_file(dir / "fed.tar");
    const std::string fifo = (dir / "fifo.tar").string();
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    shards.push_back(fifo);
    for (int s = 0; s < 50; ++s)
      shards.push_back((dir / ("missing-" + std::to_string(s))).string());

    tk::data::TarShardOptions o = label_options();
    o.shuffle_shards = false;
    o.shuffle_buffer = buffer;
    tk::data::TarShardDataset ds(shards, o);
    std::atomic<bool> stop{false};
    bool positioned = true;
    std::string thrown;
    std::thread reader([&] {
      try {
        positioned = ds.start(0, 1000000, stop);
      } catch (const std::exception& e) {
        thrown = e.what();
      }
    });
    // Non-blocking opens fail (ENXIO) until the reader has the FIFO open: poll, with a limit.
    int fd = -1;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while ((fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK)) < 0 &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    stop.store(true);
    // No REQUIRE until the join (a throw with the thread running would terminate). `fed` (10 KiB)
    // fits in the empty pipe at once, so the reader cannot close its end during the write.
    if (fd >= 0) {
      CHECK(::fcntl(fd, F_SETFL, 0) == 0);  // blocking writes from here on
      std::size_t done = 0;
      while (done < fed.size()) {
        const ssize_t w = ::write(fd, fed.data() + done, fed.size() - done);
        if (w <= 0) break;
        done += static_cast<std::size_t>(w);
      }
      ::close(fd);
    }
    reader.join();
    REQUIRE_MESSAGE(fd >= 0, "the reader never opened the FIFO: ", thrown);
    CHECK_MESSAGE(thrown.empty(), thrown);
    CHECK_FALSE(positioned);
    // It stopped within a sample of the FIFO's first one (a shuffle buffer reads ahead of it).
    const std::uint64_t k = stopped_after(ds);
    CHECK(k <= static_cast<std::uint64_t>(before) + 1);
    if (buffer == 0) CHECK(k >= static_cast<std::uint64_t>(before));
    // Usable again (a start that reads nothing), and destructible.
    ds.start(0, 0);
  }
}
