#include "textflag.h"

// func specialIndex(s []byte) int
// Returns the index of the first byte of s that is '"', '\\' or below
// 0x20, or len(s) when there is none; len(s) must be at least 16 (the
// last 16 bytes are read in one load that overlaps the ones before).
// 32 bytes a step, then 16, then the overlapping last 16.
TEXT ·specialIndex(SB), NOSPLIT, $0-32
	MOVQ s_base+0(FP), SI
	MOVQ s_len+8(FP), CX
	MOVQ SI, DI
	LEAQ -16(SI)(CX*1), DX // the last 16 bytes
	MOVQ $0x2222222222222222, AX
	MOVQ AX, X1
	PUNPCKLQDQ X1, X1
	MOVQ $0x5c5c5c5c5c5c5c5c, AX
	MOVQ AX, X2
	PUNPCKLQDQ X2, X2
	MOVQ $0x1f1f1f1f1f1f1f1f, AX
	MOVQ AX, X3
	PUNPCKLQDQ X3, X3
	PXOR X0, X0
	LEAQ -16(DX), R8 // a 32-byte step must start at or before R8

loop32:
	CMPQ SI, R8
	JA   loop16
	MOVOU (SI), X4
	MOVOU 16(SI), X7
	MOVOU X4, X5
	MOVOU X4, X6
	MOVOU X7, X8
	MOVOU X7, X9
	PCMPEQB X1, X5
	PCMPEQB X2, X6
	PSUBUSB X3, X4
	PCMPEQB X0, X4
	PCMPEQB X1, X8
	PCMPEQB X2, X9
	PSUBUSB X3, X7
	PCMPEQB X0, X7
	POR X5, X4
	POR X6, X4
	POR X8, X7
	POR X9, X7
	PMOVMSKB X4, AX
	PMOVMSKB X7, BX
	SHLL $16, BX
	ORL BX, AX
	JNZ found
	ADDQ $32, SI
	JMP loop32

loop16:
	CMPQ SI, DX
	JAE  last
	MOVOU (SI), X4
	MOVOU X4, X5
	MOVOU X4, X6
	PCMPEQB X1, X5
	PCMPEQB X2, X6
	PSUBUSB X3, X4
	PCMPEQB X0, X4
	POR X5, X4
	POR X6, X4
	PMOVMSKB X4, AX
	TESTL AX, AX
	JNZ found
	ADDQ $16, SI

last:
	// SI in (DX-16, DX]: the bytes before SI were checked.
	MOVOU (DX), X4
	MOVOU X4, X5
	MOVOU X4, X6
	PCMPEQB X1, X5
	PCMPEQB X2, X6
	PSUBUSB X3, X4
	PCMPEQB X0, X4
	POR X5, X4
	POR X6, X4
	PMOVMSKB X4, AX
	MOVQ SI, BX
	SUBQ DX, BX // bytes of the last load already checked
	MOVQ BX, CX
	SHRL CX, AX
	TESTL AX, AX
	JZ none
	BSFL AX, AX
	ADDQ BX, AX
	ADDQ DX, AX
	SUBQ DI, AX
	MOVQ AX, ret+24(FP)
	RET

none:
	MOVQ s_len+8(FP), AX
	MOVQ AX, ret+24(FP)
	RET

found:
	BSFL AX, AX
	SUBQ DI, SI
	ADDQ SI, AX
	MOVQ AX, ret+24(FP)
	RET
