# cmake -DIN=FILE -DOUT=HEADER -DNAME=ARRAY -P embed.cmake: FILE's bytes as
# a C++ array (the XDP program's object, carried inside the provider).
file(READ ${IN} hex HEX)
string(REGEX REPLACE "(..)" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE ${OUT} "// Generated from ${IN} by embed.cmake.\n#pragma once\nalignas(8) static const unsigned char ${NAME}[] = {\n${bytes}};\n")
