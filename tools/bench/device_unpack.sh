# Sourced by the device scripts: `unpack NAME DEST` writes .dev/NAME.xz (device_pack.sh) to
# DEST, executable, with xz or else Python's lzma (the device image has python3).
unpack() {
  local src=$H/$1.xz
  xz -dc "$src" > "$2" 2>/dev/null ||
    python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$src" "$2" ||
    return 1
  chmod +x "$2"
}
