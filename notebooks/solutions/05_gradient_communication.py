# Reference solution of notebook 05's exercise: GIFT's input-side round trip (Eq. 18-20), symmetric roots, full rank.
G, A = G_of["blocks.1.attn.proj"], A_of["blocks.1.attn.proj"]
codec = get_codec("fp8_e4m3")

A64 = A.double()
A_d = A64 + DAMPING * A64.diagonal().mean() * torch.eye(A64.shape[0], dtype=torch.float64)   # 1. relative damping
lam, V = torch.linalg.eigh(A_d)                                                              # A_d = V diag(lam) V^T
U = G.double() @ (V * lam.rsqrt()) @ V.T                                                     # 2. U = G A_d^(-1/2)
U_hat = codec.decode(codec.encode(U), U.numel()).view(U.shape).double()                      # 3. FP8 round trip
G_hat = U_hat @ (V * lam.sqrt()) @ V.T                                                       # 4. map back with A_d^(1/2)
answer = float((G_hat - G).norm() / G.norm())
print(f"input-side GIFT: relative error {answer:.4f}")
