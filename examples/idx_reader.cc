#include "examples/idx_reader.h"

#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace gradsync::examples {
namespace {

constexpr uint8_t kUnsignedByte = 0x08;
constexpr size_t kMaxDims = 4;

struct IdxArray {
  std::vector<size_t> dims;
  std::vector<uint8_t> data;
};

Status Malformed(const std::string& path, const std::string& what) {
  return DataLossError("malformed IDX file " + path + ": " + what);
}

// The whole decompressed content of `path` (plain files pass through).
StatusOr<std::vector<uint8_t>> ReadGzip(const std::string& path) {
  errno = 0;
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    const std::string reason = errno != 0 ? std::strerror(errno) : "cannot open";
    return NotFoundError("cannot read " + path + " (" + reason +
                         "); install the Fashion-MNIST data set with Debian's "
                         "dataset-fashion-mnist package (tools/install_deps.sh)");
  }
  std::vector<uint8_t> out;
  uint8_t buffer[1 << 16];
  int n = 0;
  while ((n = gzread(file, buffer, sizeof(buffer))) > 0) {
    out.insert(out.end(), buffer, buffer + n);
  }
  int err = Z_OK;
  const std::string message = gzerror(file, &err);
  gzclose(file);
  if (n < 0 || err != Z_OK) {
    return Malformed(path, "gzip stream is corrupt or truncated (" + message + ")");
  }
  return out;
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

StatusOr<IdxArray> Parse(const std::string& path, std::vector<uint8_t> bytes) {
  if (bytes.size() < 4) {
    return Malformed(path, "shorter than the 4-byte magic number");
  }
  if (bytes[0] != 0 || bytes[1] != 0 || bytes[2] != kUnsignedByte || bytes[3] == 0 ||
      bytes[3] > kMaxDims) {
    char magic[16];
    std::snprintf(magic, sizeof(magic), "0x%08x", BigEndian32(bytes.data()));
    return Malformed(path, std::string("bad magic number ") + magic +
                               " (want 0x000008NN: unsigned bytes, 1 to 4 dimensions)");
  }
  IdxArray array;
  const size_t header = 4 + 4 * size_t{bytes[3]};
  if (bytes.size() < header) return Malformed(path, "truncated in the header");
  size_t expected = 1;
  for (size_t d = 0; d < bytes[3]; ++d) {
    array.dims.push_back(BigEndian32(bytes.data() + 4 + 4 * d));
    expected *= array.dims.back();
    if (expected > bytes.size()) {
      break;  // cannot fit; also keeps the product small
    }
  }
  const size_t have = bytes.size() - header;
  if (have != expected) {
    return Malformed(path, "the header promises " + std::to_string(expected) +
                               " bytes of data but the file holds " + std::to_string(have) +
                               (have < expected ? " (truncated)" : " (trailing bytes)"));
  }
  bytes.erase(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(header));
  array.data = std::move(bytes);
  return array;
}

StatusOr<IdxArray> ReadIdx(const std::string& path, size_t rank) {
  GS_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadGzip(path));
  GS_ASSIGN_OR_RETURN(IdxArray array, Parse(path, std::move(bytes)));
  if (array.dims.size() != rank) {
    return Malformed(path, "has " + std::to_string(array.dims.size()) + " dimensions, expected " +
                               std::to_string(rank));
  }
  return array;
}

}  // namespace

StatusOr<IdxImages> ReadIdxImages(const std::string& path) {
  GS_ASSIGN_OR_RETURN(IdxArray array, ReadIdx(path, 3));
  IdxImages images;
  images.count = array.dims[0];
  images.rows = array.dims[1];
  images.cols = array.dims[2];
  images.pixels = std::move(array.data);
  return images;
}

StatusOr<std::vector<uint8_t>> ReadIdxLabels(const std::string& path) {
  GS_ASSIGN_OR_RETURN(IdxArray array, ReadIdx(path, 1));
  return std::move(array.data);
}

StatusOr<LabelledImages> ReadFashionMnist(const std::string& dir, bool train, int num_classes) {
  const std::string prefix = dir + "/" + (train ? "train" : "t10k");
  const std::string labels_path = prefix + "-labels-idx1-ubyte.gz";
  LabelledImages set;
  GS_ASSIGN_OR_RETURN(set.images, ReadIdxImages(prefix + "-images-idx3-ubyte.gz"));
  GS_ASSIGN_OR_RETURN(set.labels, ReadIdxLabels(labels_path));
  if (set.labels.size() != set.images.count) {
    return DataLossError(prefix + "-*: " + std::to_string(set.images.count) + " images but " +
                         std::to_string(set.labels.size()) + " labels");
  }
  for (size_t i = 0; i < set.labels.size(); ++i) {
    if (set.labels[i] >= num_classes) {
      return Malformed(labels_path, "label " + std::to_string(set.labels[i]) + " at index " +
                                        std::to_string(i) + " is not below " +
                                        std::to_string(num_classes));
    }
  }
  return set;
}

}  // namespace gradsync::examples
