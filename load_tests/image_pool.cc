#include "load_tests/image_pool.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "client/mask_codec.h"
#include "load_tests/workload.h"
#include "model/io/image_codec.h"

namespace maskd::load {

StatusOr<std::vector<ImageAsset>> GenerateImagePool(int count, int width, int height, uint64_t seed,
                                                    int quality) {
  if (count < 1) return InvalidArgument("--images " + std::to_string(count) + ": expected >= 1");
  if (width < 1 || height < 1) {
    return InvalidArgument("--size " + std::to_string(width) + "x" + std::to_string(height) +
                           ": expected positive width and height");
  }
  std::vector<ImageAsset> pool;
  for (int i = 0; i < count; ++i) {
    StatusOr<std::string> jpeg = EncodeJpeg(GenerateImage(MixSeed(seed, 0, i), width, height), quality);
    if (!jpeg.ok()) return jpeg.status();
    pool.push_back({"generated-" + std::to_string(i), std::move(*jpeg), width, height, true});
  }
  return pool;
}

StatusOr<std::vector<ImageAsset>> LoadImageFolder(const std::string& dir, int max_count,
                                                  bool reencode_as_jpeg, int quality) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return InvalidArgument("--image-dir " + dir + ": not a directory");
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;
    std::string ext = e.path().extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
    if (ext == ".jpg" || ext == ".jpeg" || ext == ".png" || ext == ".webp") files.push_back(e.path());
  }
  if (ec) return InvalidArgument("--image-dir " + dir + ": " + ec.message());
  std::sort(files.begin(), files.end());
  if (max_count > 0 && files.size() > static_cast<size_t>(max_count)) files.resize(max_count);
  if (files.empty()) return InvalidArgument("--image-dir " + dir + ": no .jpg/.jpeg/.png/.webp files");

  std::vector<ImageAsset> pool;
  for (const fs::path& path : files) {
    StatusOr<std::string> bytes = client::ReadFileBytes(path.string());
    if (!bytes.ok()) return bytes.status();
    StatusOr<ImageRGB8> image = DecodeImage(*bytes, {}, path.string());
    if (!image.ok()) return image.status();
    ImageAsset asset{path.filename().string(), std::move(*bytes), image->width, image->height, false};
    asset.is_jpeg = DetectImageFormat(asset.encoded) == ImageFormat::kJpeg;
    if (!asset.is_jpeg && reencode_as_jpeg) {
      StatusOr<std::string> jpeg = EncodeJpeg(*image, quality);
      if (!jpeg.ok()) return jpeg.status();
      asset.encoded = std::move(*jpeg);
      asset.is_jpeg = true;
    }
    pool.push_back(std::move(asset));
  }
  return pool;
}

}  // namespace maskd::load
