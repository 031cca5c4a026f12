#include "textflag.h"

// func controlBlocks(s []byte) bool
// Reports whether s[:len(s)&^63] holds a byte below 0x20 (SSE2: a byte
// minus 0x1f, saturated, is 0 exactly for those).
TEXT ·controlBlocks(SB), NOSPLIT, $0-25
	MOVQ s_base+0(FP), SI
	MOVQ s_len+8(FP), CX
	SHRQ $6, CX
	JZ   none
	MOVQ $0x1f1f1f1f1f1f1f1f, AX
	MOVQ AX, X1
	PUNPCKLQDQ X1, X1
	PXOR X0, X0

loop:
	MOVOU 0(SI), X2
	MOVOU 16(SI), X3
	MOVOU 32(SI), X4
	MOVOU 48(SI), X5
	PSUBUSB X1, X2
	PSUBUSB X1, X3
	PSUBUSB X1, X4
	PSUBUSB X1, X5
	PMINUB X3, X2
	PMINUB X5, X4
	PMINUB X4, X2
	PCMPEQB X0, X2
	PMOVMSKB X2, AX
	TESTL AX, AX
	JNZ found
	ADDQ $64, SI
	DECQ CX
	JNZ loop

none:
	MOVB $0, ret+24(FP)
	RET

found:
	MOVB $1, ret+24(FP)
	RET
