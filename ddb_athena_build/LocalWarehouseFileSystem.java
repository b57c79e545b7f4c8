package ddb_athena.hadoop;

import java.io.IOException;
import java.net.URI;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermissions;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system for the local Iceberg warehouse, without a process for every file it writes.
 *
 * <p>Without Hadoop's native library (no wheel ships it), RawLocalFileSystem sets the permission of every file it
 * creates by running {@code chmod}: a process for each data, delete, manifest and metadata file and for each one's
 * .crc file, about 20 in a sync cycle. This one sets the same permission through java.nio.
 *
 * <p>It also writes and reads no .crc files. They doubled the files of every commit and every read opened one; S3,
 * the warehouse in production, has none. Hadoop still removes a file's old .crc when it writes or deletes the file,
 * so a warehouse written before stays readable by Hadoop's own file system.
 */
public class LocalWarehouseFileSystem extends LocalFileSystem {
  public LocalWarehouseFileSystem() {
    super(new NioPermissions());
  }

  @Override
  public void initialize(URI name, Configuration conf) throws IOException {
    super.initialize(name, conf);
    setWriteChecksum(false);
    setVerifyChecksum(false);
  }

  static class NioPermissions extends RawLocalFileSystem {
    @Override
    public void setPermission(Path path, FsPermission permission) throws IOException {
      if (permission.getStickyBit()) {
        // java.nio has no sticky bit: Hadoop's chmod sets it.
        super.setPermission(path, permission);
        return;
      }
      Files.setPosixFilePermissions(pathToFile(path).toPath(), PosixFilePermissions.fromString(permission.toString()));
    }
  }
}
