// Reads IDX files (the format of MNIST and Fashion-MNIST), gzip-compressed or
// plain, into memory.
//
// An IDX file is a big-endian header (two zero bytes, a type byte, a rank
// byte, then one uint32 per dimension) followed by the elements in row-major
// order. Only unsigned-byte files (type 0x08) are read: images of rank 3
// ([count, rows, cols]) and labels of rank 1 ([count]).
//
// Errors: NotFound when a file cannot be opened (the message names the path
// and the Debian package that provides the data set); DataLoss when a file is
// malformed (bad magic, wrong rank, truncated, trailing bytes, corrupt gzip
// stream, image and label counts that disagree, a label out of range).
//
// Thread-safety: free functions without shared state.
#ifndef GRADSYNC_EXAMPLES_IDX_READER_H_
#define GRADSYNC_EXAMPLES_IDX_READER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace gradsync::examples {

// Where Debian's dataset-fashion-mnist installs the data set.
inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

struct IdxImages {
  size_t count = 0;
  size_t rows = 0;
  size_t cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols, image after image
};

// A labelled set of images: images.count == labels.size().
struct LabelledImages {
  IdxImages images;
  std::vector<uint8_t> labels;
};

// Reads a rank-3 unsigned-byte IDX file.
StatusOr<IdxImages> ReadIdxImages(const std::string& path);

// Reads a rank-1 unsigned-byte IDX file.
StatusOr<std::vector<uint8_t>> ReadIdxLabels(const std::string& path);

// Reads "<dir>/train-images-idx3-ubyte.gz" and
// "<dir>/train-labels-idx1-ubyte.gz" (or the "t10k-" pair when `train` is
// false) and checks that they agree and that every label is below
// `num_classes`.
StatusOr<LabelledImages> ReadFashionMnist(const std::string& dir, bool train, int num_classes = 10);

}  // namespace gradsync::examples

#endif  // GRADSYNC_EXAMPLES_IDX_READER_H_
