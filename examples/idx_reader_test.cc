#include "examples/idx_reader.h"

#include <zlib.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace gradsync::examples {
namespace {

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

void PutBigEndian(uint32_t v, std::vector<uint8_t>* out) {
  for (int shift = 24; shift >= 0; shift -= 8) {
    out->push_back(static_cast<uint8_t>(v >> shift));
  }
}

std::vector<uint8_t> Idx(std::vector<uint32_t> dims, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) PutBigEndian(d, &out);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void WriteGzip(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

std::vector<uint8_t> Ramp(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7);
  return v;
}

TEST(IdxReaderTest, ReadsValidImagesAndLabels) {
  const std::string images = TmpPath("valid-images.gz");
  const std::string labels = TmpPath("valid-labels.gz");
  WriteGzip(images, Idx({3, 2, 4}, Ramp(24)));
  WriteGzip(labels, Idx({3}, {7, 0, 9}));
  auto read = ReadIdxImages(images);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->count, 3u);
  EXPECT_EQ(read->rows, 2u);
  EXPECT_EQ(read->cols, 4u);
  EXPECT_EQ(read->pixels, Ramp(24));
  auto read_labels = ReadIdxLabels(labels);
  ASSERT_TRUE(read_labels.ok()) << read_labels.status();
  EXPECT_EQ(*read_labels, (std::vector<uint8_t>{7, 0, 9}));
}

TEST(IdxReaderTest, MissingFileNamesThePathAndThePackage) {
  const std::string path = TmpPath("no-such-file.gz");
  auto read = ReadIdxImages(path);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kNotFound);
  EXPECT_NE(read.status().message().find(path), std::string::npos) << read.status();
  EXPECT_NE(read.status().message().find("dataset-fashion-mnist"), std::string::npos);
}

TEST(IdxReaderTest, BadMagicIsDataLoss) {
  const std::string path = TmpPath("bad-magic.gz");
  std::vector<uint8_t> bytes = Idx({2}, {1, 2});
  bytes[2] = 0x0D;  // float elements
  WriteGzip(path, bytes);
  auto read = ReadIdxLabels(path);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(read.status().message().find("bad magic number 0x00000d01"), std::string::npos)
      << read.status();
}

TEST(IdxReaderTest, TruncatedDataIsDataLoss) {
  const std::string path = TmpPath("truncated.gz");
  WriteGzip(path, Idx({3, 2, 4}, Ramp(20)));
  auto read = ReadIdxImages(path);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(read.status().message().find("promises 24 bytes of data but the file holds 20"),
            std::string::npos)
      << read.status();
}

TEST(IdxReaderTest, TruncatedHeaderAndTrailingBytesAreDataLoss) {
  const std::string header = TmpPath("short-header.gz");
  WriteGzip(header, {0, 0, 0x08, 3, 0, 0, 0, 1});
  auto read = ReadIdxImages(header);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("truncated in the header"), std::string::npos);

  const std::string trailing = TmpPath("trailing.gz");
  WriteGzip(trailing, Idx({2}, {1, 2, 3}));
  auto labels = ReadIdxLabels(trailing);
  ASSERT_FALSE(labels.ok());
  EXPECT_NE(labels.status().message().find("trailing bytes"), std::string::npos);
}

TEST(IdxReaderTest, CutGzipStreamIsDataLoss) {
  const std::string whole = TmpPath("whole.gz");
  WriteGzip(whole, Idx({50, 8, 8}, Ramp(3200)));
  FILE* f = std::fopen(whole.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  std::vector<char> raw(1 << 16);
  raw.resize(std::fread(raw.data(), 1, raw.size(), f));
  std::fclose(f);
  const std::string cut = TmpPath("cut.gz");
  f = std::fopen(cut.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(raw.data(), 1, raw.size() / 2, f);
  std::fclose(f);
  auto read = ReadIdxImages(cut);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kDataLoss) << read.status();
}

TEST(IdxReaderTest, WrongRankIsDataLoss) {
  const std::string path = TmpPath("rank1.gz");
  WriteGzip(path, Idx({4}, {1, 2, 3, 4}));
  auto read = ReadIdxImages(path);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("has 1 dimensions, expected 3"), std::string::npos);
}

TEST(IdxReaderTest, FashionMnistPairMustAgree) {
  const std::string dir = TmpPath("");
  WriteGzip(dir + "/t10k-images-idx3-ubyte.gz", Idx({2, 1, 1}, {5, 6}));
  WriteGzip(dir + "/t10k-labels-idx1-ubyte.gz", Idx({3}, {1, 2, 3}));
  auto read = ReadFashionMnist(dir, /*train=*/false);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("2 images but 3 labels"), std::string::npos);

  WriteGzip(dir + "/t10k-labels-idx1-ubyte.gz", Idx({2}, {1, 12}));
  read = ReadFashionMnist(dir, /*train=*/false);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("label 12 at index 1"), std::string::npos);

  WriteGzip(dir + "/t10k-labels-idx1-ubyte.gz", Idx({2}, {1, 9}));
  read = ReadFashionMnist(dir, /*train=*/false);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->labels, (std::vector<uint8_t>{1, 9}));
}

}  // namespace
}  // namespace gradsync::examples
